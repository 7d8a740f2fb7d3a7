"""One turn: the driver, its seams, in-turn native compaction, the budget and cost.

May import: config, store, model, tools, compaction.
"""
