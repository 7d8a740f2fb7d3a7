"""``roder serve``'s connections send each streamed event at once (``TCP_NODELAY``).

Without it, every SSE event after the first waited for the client's delayed ACK (about
40 ms on Linux, Nagle's algorithm): the SDK's first ``response.output_text.delta`` came
40 ms late. asyncio sets ``TCP_NODELAY`` only on sockets accepted from a listening socket
whose ``proto`` is ``IPPROTO_TCP``, so the listening socket must say so.
"""

from __future__ import annotations

import asyncio
import socket

from roder_server._command import listen_socket


def _accepted_nodelay(listener: socket.socket) -> int:
    """Return TCP_NODELAY of a connection accepted by asyncio from ``listener``."""

    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Server, sock=listener)
        try:
            port = listener.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await asyncio.wait_for(accepted, 30)
            finally:
                writer.close()
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def test_connections_accepted_by_roder_serve_have_tcp_nodelay() -> None:
    listener, family = listen_socket("127.0.0.1", 0)
    assert family == socket.AF_INET
    assert listener.proto == socket.IPPROTO_TCP
    assert _accepted_nodelay(listener) != 0


def test_a_socket_made_without_the_protocol_does_not_get_it() -> None:
    # What the server made before: asyncio then leaves Nagle's algorithm on.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    assert _accepted_nodelay(listener) == 0
