"""A posted transfer: its handle (done / wait / cancel), the errors it raises, and what it did
(TransferStats). A transfer is one or more parts, each one NIXL transfer; a staged read's part
also unpacks its staging bytes into the cache once its NIXL transfer is done, then posts the next
part."""
from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable


class NixlError(RuntimeError):
    """A NIXL transfer failed."""


class PeerGoneError(NixlError, ConnectionError):
    """The peer of a transfer has gone away (its process ended or its Endpoint closed)."""


def nixl_error(e: Exception, what: str, peer: str) -> NixlError:
    text = f"{type(e).__name__}: {e}"
    if "Disconnect" in type(e).__name__ or "DISCONNECT" in str(e):
        return PeerGoneError(f"{what}: peer {peer!r} has gone away ({text})")
    return NixlError(f"{what} with peer {peer!r} failed ({text})")


@dataclass
class TransferStats:
    """What one transfer did. pieces: the descriptors the backend posted (NIXL's telemetry when
    the agent captures it, else the count handed to NIXL); build_s: span checks, descriptor
    lists and NIXL's preparation and request creation (before the first post); post_s: the
    posting calls (a loopback cma read moves its bytes inside them); move_s: from the first
    post to the last completion (staged: unpacks included); unpack_s: staged reads' copies out
    of the staging buffer (a staged read of runs: the regroup, copy_runs); plan_s: planning
    the runs (read_tokens; a caller that plans its own runs may set it, as the vLLM
    connector does for a grouped cache's read), wall time, and
    plan_cpu_s the planning thread's CPU time in it (the rest: waiting for the GIL or a core).
    Where a transfer's time went: plan_s, then build_s, then move_s, of which unpack_s is the
    regroup; a packed read (path "packed", kvcache_ext.vllm) has the producer's re-tiling as
    pack_s (pack_cpu_s of it the packing thread's CPU time: the rest, waiting for the producer's
    core or GIL) and the consumer's wait for it as pack_wait_s."""

    path: str                 # "plain", "prepared", "strided", "staged" or "packed"
    spans: int                # spans asked for (runs: the pieces they stand for)
    bytes: int                # bytes they cover
    runs: int = 0             # strided runs asked for (0: the transfer was given spans)
    pieces: int = 0
    parts: int = 0            # NIXL transfers posted
    staged_bytes: int = 0     # bytes read into the staging buffer (the spans' bytes and gaps)
    prepared: bool = False    # this transfer prepared a peer's descriptor list (first use)
    plan_s: float = 0.0       # the runs planned (read_tokens: TransferPlan.token_runs)
    plan_cpu_s: float = 0.0   # the planning thread's CPU time in plan_s (time.thread_time)
    build_s: float = 0.0      # up to the first post: checks, lists_s and prep_s
    lists_s: float = 0.0      # descriptor lists, index arrays, runs, extents (numpy)
    prep_s: float = 0.0       # NIXL: get_xfer_descs, prep_xfer_dlist, initialize / make_prepped
    post_s: float = 0.0
    move_s: float = 0.0
    unpack_s: float = 0.0
    pack_s: float = 0.0       # a packed read (kvcache_ext.vllm): the producer's re-tiling into
    #                           the consumer's page form, as it reports it (its own core)
    pack_cpu_s: float = 0.0   # a packed read: the producer's packing thread's CPU in pack_s
    pack_wait_s: float = 0.0  # a packed read: the consumer waiting for parts to be packed
    #                           (the wait for part 0 is not counted in build_s)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Part:
    """One NIXL transfer of a handle: make() creates (and prepares) it, returning the NIXL
    handle and the pieces handed to NIXL; after() runs once it is done (a staged read's
    unpack); cleanup() frees what make() prepared for it alone."""

    make: Callable[[], tuple[object, int]]
    after: Callable[[], None] | None = None
    cleanup: Callable[[], None] | None = None
    xfer: object = field(default=None, repr=False)
    pieces: int = 0  # descriptors handed to NIXL
    overlap: bool = False  # after() runs on the Endpoint's unpack thread, beside the next part


class TransferHandle:
    """One transfer (one or more NIXL transfers). done() polls (and drives progress);
    wait(timeout_s) returns when it has finished, and raises TimeoutError, PeerGoneError or
    NixlError otherwise. `stats` says what it did (complete once done).

    Threads: the caller's thread drives it (done, wait, cancel) while another may give it up
    (the Endpoint closing, the peer removed): each of those holds the handle's own lock, and
    none takes it while holding the Endpoint's lock (the order is handle, then Endpoint)."""

    def __init__(self, ep, peer, op: str, parts: list[Part], stats: TransferStats,
                 on_end: Callable[[], None] | None = None) -> None:
        self._ep, self.peer, self.op = ep, peer, op
        self.spans, self.bytes = stats.spans, stats.bytes
        self.stats = stats
        self._parts, self._next = parts, 0
        self._current: Part | None = None
        self._t0 = 0.0
        self._on_end = on_end   # once, when it ends however it ends (a staging buffer's return)
        self._done = not parts
        self._abandoned = False  # given up from outside before it finished (_abandon)
        self._why = ""
        self._cancelled = False  # cancel() gave it up before it finished
        self._unpacks: list = []  # futures of overlapped after() calls, one per part so far
        self._reads_done = False
        self._mu = threading.RLock()

    @property
    def _xfer(self):
        return self._current.xfer if self._current is not None else None

    def _post_next(self, since: float | None = None) -> None:
        """Post the next part, and the ones after it while each finishes as it is posted (a
        loopback read moves its bytes inside the posting call): a loop, not a recursion, so a
        read of thousands of parts does not exhaust Python's stack."""
        while self._post_one(since):
            since = None

    def _post_one(self, since: float | None) -> bool:
        """Create and post the next part (NixlError when NIXL refuses or fails it); since: when
        the transfer's checks began (its first part's build time counts from there). Part j
        reuses the staging half of part j - 2: that part's unpack must have finished. -> True
        when it finished at once and another part is to be posted."""
        if self._next >= 2 and len(self._unpacks) >= self._next - 1:
            self._unpacks[self._next - 2].result()
        if self._ep._peer_removed(self.peer):
            self._abandon(f"peer {self.peer.name!r} was removed during the {self.op}")
            raise NixlError(self._why)
        part = self._parts[self._next]
        self._next += 1
        t = time.perf_counter() if since is None else since
        try:
            xfer, pieces = part.make()
        except Exception as e:
            if part.cleanup is not None:
                part.cleanup()
            self._end()
            if isinstance(e, NixlError):
                raise
            raise nixl_error(e, f"NIXL {self.op} of {self.spans} spans", self.peer.name) from None
        t1 = time.perf_counter()
        part.xfer, part.pieces, self._current = xfer, pieces, part
        if self._t0 == 0.0:
            self._t0 = t1
        if self._next == 1:
            self.stats.build_s = t1 - t
        self.stats.parts += 1
        state = self._ep._post(self, xfer)
        self.stats.post_s += time.perf_counter() - t1
        if state == "ERR":
            self._finish_part(ok=False)
            self._end()
            raise NixlError(f"NIXL {self.op} of {self.spans} spans with peer {self.peer.name!r} "
                            f"failed when posted")
        return state != "PROC" and self._complete_part(post_next=False)

    def _finish_part(self, ok: bool) -> None:
        part, self._current = self._current, None
        if part is None:
            return
        self.stats.pieces += self._ep._telemetry_pieces(part.xfer, part.pieces) if ok else part.pieces
        self._ep._release(self, part.xfer)
        part.xfer = None
        if part.cleanup is not None:
            part.cleanup()

    def _complete_part(self, post_next: bool = True) -> bool:
        """The current part is done: its unpack runs (or is queued), then the next part is
        posted (post_next) -- or, returning True, left to the caller's loop."""
        part = self._current
        self._finish_part(ok=True)
        if part.after is not None:
            if part.overlap:
                self._unpacks.append(self._ep._unpacker().submit(self._timed, part.after))
            else:
                self._timed(part.after)
        if self._next < len(self._parts):
            if not post_next:
                return True
            self._post_next()
        else:
            self._reads_done = True
            self._settle()
        return False

    def _timed(self, fn: Callable[[], None]) -> None:
        t = time.perf_counter()
        fn()
        self.stats.unpack_s += time.perf_counter() - t

    def _settle(self) -> bool:
        """Every read done: finished once every overlapped unpack is (NixlError if one failed)."""
        if not all(f.done() for f in self._unpacks):
            return False
        errors = [f.exception() for f in self._unpacks if f.exception() is not None]
        self.stats.move_s = time.perf_counter() - self._t0
        self._end()
        if errors:
            raise NixlError(f"unpacking the staged {self.op} of {self.spans} spans failed: "
                            f"{type(errors[0]).__name__}: {errors[0]}")
        return True

    def _end(self) -> None:
        for f in self._unpacks:  # nothing may still read the staging buffer when it goes back
            f.exception()
        if self._on_end is not None:
            self._on_end()
            self._on_end = None
        self._done = True
        self._ep._ended(self)

    def done(self) -> bool:
        with self._mu:
            return self._done_locked()

    def _done_locked(self) -> bool:
        if self._abandoned:
            raise NixlError(self._why)
        if self._cancelled:
            raise NixlError(f"the {self.op} of {self.spans} spans with peer {self.peer.name!r} "
                            f"was cancelled before it finished: its bytes are undefined")
        if self._done:
            return True
        if self._reads_done:
            return self._settle()
        state = self._ep._state(self)
        if state == "PROC":
            return False
        if state == "ERR":
            self._finish_part(ok=False)
            self._end()
            raise NixlError(f"NIXL {self.op} of {self.spans} spans ({self.bytes} B) with peer "
                            f"{self.peer.name!r} failed")
        self._complete_part()
        return self._done

    def _abandon(self, why: str) -> None:
        """Given up from outside (the Endpoint closing, the peer removed): its NIXL transfer is
        released, and it ends once no unpack of it still runs (nothing may land in the cache or
        read the staging buffer after that). done() raises NixlError(why) from then on."""
        with self._mu:
            if self._done:
                return
            self._why = f"{why}: the bytes of its {self.spans} spans are undefined"
            part, self._current = self._current, None
            if part is not None:
                self._ep._release(self, part.xfer)
                part.xfer = None
                if part.cleanup is not None:
                    part.cleanup()
            self._abandoned = True
            self._end()

    def cancel(self) -> None:
        """Give up on an unfinished transfer (NIXL aborts it; no later part is posted); the
        bytes it covers are undefined, and done() / wait() raise NixlError from then on. A
        finished transfer stays finished."""
        with self._mu:
            if not self._done:
                self._finish_part(ok=False)
                self._cancelled = True
                self._end()

    def wait(self, timeout_s: float) -> None:
        """Return when the transfer has finished; raise TimeoutError after timeout_s seconds. A
        timed-out transfer keeps running (its bytes stay undefined) until it finishes or the
        caller calls cancel()."""
        if not (isinstance(timeout_s, (int, float)) and timeout_s >= 0):
            raise ValueError(f"timeout_s must be a number >= 0, got {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        while not self.done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"NIXL {self.op} of {self.spans} spans ({self.bytes} B) with "
                                   f"peer {self.peer.name!r} not finished after {timeout_s} s")
            if self._reads_done:  # only unpacks left: sleep on them, not beside them (a
                # spinning waiter takes the unpack thread's core share where both share a core)
                futures.wait([f for f in list(self._unpacks) if not f.done()], timeout=left)
            else:
                time.sleep(0)  # let the poller and other threads in; keep driving progress
