"""``roder_api.extension`` keeps every public name of the plugin-loading module it was split
from (``roder_api._plugin_loading``)."""

from __future__ import annotations


def test_the_plugin_loading_names_are_importable_from_roder_api_extension() -> None:
    import roder_api._plugin_loading as loading
    import roder_api.extension as extension

    for name in loading.__all__:
        if name != "load_with_deadline":
            assert name in extension.__all__, name
        assert getattr(extension, name) is getattr(loading, name), name
