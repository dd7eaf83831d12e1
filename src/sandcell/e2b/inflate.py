"""Decompressing an uploaded body with a bound on what it becomes.

The service's body limit counts the bytes received; a gzip body of a few megabytes can inflate
to gigabytes (about 1000 to 1). So the decompressed size is bounded as it is produced: the
decompressor is fed a piece at a time and asked for at most what is still allowed, and the
upload is refused (413) the moment it would pass the limit, before the rest is inflated.
"""

from __future__ import annotations

import zlib

from sandcell.e2b.errors import E2BError

__all__ = ["gunzip_bounded"]

_PIECE = 64 * 1024
_GZIP = 16 + zlib.MAX_WBITS
"""zlib's window bits for a gzip header and trailer."""


def _too_large(limit: int) -> E2BError:
    return E2BError(
        413,
        f"the gzip body decompresses to over {limit} bytes, the service's body limit; send a "
        "smaller file, or a larger limit (sandcell serve --max-body-mb)",
    )


def gunzip_bounded(data: bytes, *, limit: int) -> bytes:
    """``data`` (one or more gzip members) decompressed, or a 413 once the output would pass
    ``limit`` bytes, or a 400 if it is not valid gzip."""
    out = bytearray()
    pending = data
    try:
        while True:
            inflater = zlib.decompressobj(_GZIP)
            while not inflater.eof:
                # max_length bounds each call's output; the input it did not consume waits in
                # unconsumed_tail, so nothing past the limit is ever produced.
                room = limit - len(out) + 1
                piece = inflater.decompress(pending, min(room, _PIECE))
                out += piece
                if len(out) > limit:
                    raise _too_large(limit)
                if not piece and not pending:
                    raise E2BError(400, "the body is not valid gzip: it ends inside a stream")
                pending = inflater.unconsumed_tail
            # A gzip file may hold several members, one after another (gzip.decompress reads
            # them all): go on with what follows this one.
            pending = inflater.unused_data
            if not pending:
                return bytes(out)
    except zlib.error as exc:
        raise E2BError(400, f"the body is not valid gzip: {exc}") from None
