"""How ``knobtune serve`` meets the network: uvicorn's options from the settings.

- **Proxy headers only from the operator's proxies.** uvicorn believes
  ``X-Forwarded-For``/``-Proto`` from 127.0.0.1 and ::1 by default (its
  ``FORWARDED_ALLOW_IPS``): a client on the service's host, or a local proxy that passes
  the header on, could then claim any address, and wrong tokens, counted per address,
  were never throttled. Here they are believed only from ``KNOBTUNE_TRUSTED_PROXIES``
  (default: none, and then proxy headers are off).
- **A deadline for a request's headers.** uvicorn (checked on 0.54, h11 and httptools)
  has none: ``timeout_keep_alive`` runs only between requests and stops at the first
  byte of the next one, so a client sending half a request line held its connection for
  good (its issue #157 lists ``--timeout-request-start`` as never built).
  :class:`HeaderTimeoutProtocol` is uvicorn's h11 protocol with one: the request line and
  headers must be complete ``KNOBTUNE_HEADER_TIMEOUT_S`` after the connection opened, or
  after the previous response on a kept-alive one; otherwise the connection is closed.
  The body is not under this deadline (an import may stream for minutes).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from app.settings import Settings, get_settings

log = logging.getLogger(__name__)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete
    within the deadline. uvicorn imports it by name in each worker process
    (``http="app.api.transport:HeaderTimeoutProtocol"``), so it reads the deadline from
    the process's settings (the environment), not from an argument."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = get_settings().header_timeout_s
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_after: object = None  # the cycle that was current when armed

    def _arm(self) -> None:
        self._disarm()
        self._waiting_after = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_seen(self) -> None:
        # A new request's headers were parsed: uvicorn made a new cycle for it.
        if self._deadline is not None and self.cycle is not self._waiting_after:
            self._disarm()

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if self.cycle is self._waiting_after and not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.info(
                "closed the connection of %s: no complete request headers within %g s "
                "(KNOBTUNE_HEADER_TIMEOUT_S)",
                client,
                self.header_timeout_s,
            )
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._headers_seen()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection has its own deadline
            self._headers_seen()  # unless it was pipelined and is parsed already

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def uvicorn_options(settings: Settings | None = None) -> dict[str, Any]:
    """uvicorn.run's keyword arguments that the settings decide (module doc)."""
    settings = settings or get_settings()
    proxies = list(settings.trusted_proxies)
    return {
        "http": f"{__name__}:{HeaderTimeoutProtocol.__name__}",
        "proxy_headers": bool(proxies),
        # never None: uvicorn would fall back to $FORWARDED_ALLOW_IPS or loopback
        "forwarded_allow_ips": proxies,
    }
