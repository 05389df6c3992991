"""The runner that carries batches out, one per serving process: it finds the batches that have
work left and runs them, each under a lease: the input file checked (`core.batches.check_lines`),
each line served as the batch's key would be served live (the same pipeline, routing, limits and
providers as a request over HTTP: gateway.pipeline.stages), its answer stored as it comes, then
the output and error files written. A line the gateway refuses goes to the error file; a rate
limit makes the line wait, never fail it. A gateway started again finds its batches where they
were.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import orjson

from core.batches import (
    Checked,
    Line,
    LineCheck,
    LineError,
)
from core.errors import GatewayError, InvalidRequest, NotFound, RateLimited, internal
from core.files import BATCH_OUTPUT, new_file_id
from gateway.asgi import Message, caller_stays
from gateway.jobs.batches import bounded, now
from gateway.jobs.batchstore import ACTIVE, Answer, BatchStore, Record, lease_name
from gateway.jobs.filestore import file_object
from gateway.jobs.leases import leases_for
from gateway.metrics import RequestRecord
from gateway.pipeline.exchange import Ids, Inbound, Reply
from gateway.pipeline.stages import LineServer
from gateway.runtime import Runtime

log = logging.getLogger("gateway.batches")
RATE_LIMIT_WAIT_S = 1.0  # when a refusal does not say how long to wait
RENEWALS = 6  # a lease is renewed this many times in its term
CHUNK = 256 * 1024  # an output file is written in pieces of about this size
# A batch's endpoint (its URL) → how a line is served and the metrics' operation it counts as.
Lines = Mapping[str, tuple[LineServer, str]]


class Runner:
    """Runs the batches that have work left, each under a lease (gateway.jobs.leases), a bounded
    number of lines at a time across all of them: `max_concurrency`, or `live_concurrency` while
    live requests are being served. `runtime()` is the runtime new work uses (a reload's swap
    applies to the next line); the leases are those of the config the process started with."""

    def __init__(self, runtime: Callable[[], Runtime], lines: Lines) -> None:
        self._runtime = runtime
        self.lines = lines
        self._running: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ids = Ids()
        self._lines = 0  # lines in flight, all batches together
        self._room = asyncio.Condition()
        rt = runtime()
        self.leases = leases_for(rt.config.rate_limit, rt.files)
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="batches")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.leases.aclose()

    async def _watch(self) -> None:
        while True:
            rt = self._runtime()
            with contextlib.suppress(Exception):  # a store that fails now may not later
                await self._pick_up(rt)
            await asyncio.sleep(rt.config.batches.poll_s)

    async def _pick_up(self, rt: Runtime) -> None:
        store = BatchStore(rt.files)
        for record in await store.under_way():
            batch_id = record["batch"]["id"]
            if record["batch"]["status"] not in ACTIVE or batch_id in self._running:
                continue
            if await self.leases.claim(lease_name(record), self.holder, rt.config.batches.lease_s):
                task = asyncio.create_task(self._run(record), name=f"batch {batch_id}")
                self._running[batch_id] = task
                task.add_done_callback(functools.partial(self._done, batch_id))

    def _done(self, batch_id: str, _: asyncio.Task[None]) -> None:
        self._running.pop(batch_id, None)

    async def _run(self, record: Record) -> None:
        metrics = self.runtime().metrics
        metrics.batches_running_add(1)
        try:
            await Run(self, record).carry_out()
        except asyncio.CancelledError:
            raise  # stopped with the process: the lease lapses, and the batch goes on later
        except Exception:
            log.exception("batch %s failed", record["batch"]["id"])
        finally:
            metrics.batches_running_add(-1)
        await self.leases.release(lease_name(record), self.holder)

    @contextlib.asynccontextmanager
    async def line_slot(self) -> AsyncIterator[None]:
        """Room for one more line in flight: lines yield to live requests."""
        async with self._room:
            await self._room.wait_for(self._has_room)
            self._lines += 1
            if self._has_room():
                self._room.notify()  # room for more (live traffic ended): the next waiter
        metrics = self.runtime().metrics
        metrics.batch_lines_add(1)
        try:
            yield
        finally:
            metrics.batch_lines_add(-1)
            async with self._room:
                self._lines -= 1
                self._room.notify()

    def _has_room(self) -> bool:
        """Asked when a line ends, one waiter at a time (with no line in flight there is always
        room, so someone always asks again)."""
        rt = self._runtime()
        limits = rt.config.batches
        return self._lines < (limits.live_concurrency if rt.live else limits.max_concurrency)

    def runtime(self) -> Runtime:
        return self._runtime()

    @property
    def ids(self) -> Ids:
        return self._ids

    def next_id(self) -> str:
        return self._ids.next()


class Run:
    """One batch carried out from where its record says it is."""

    def __init__(self, runner: Runner, record: Record) -> None:
        self.runner = runner
        self.record = record
        self.batch = record["batch"]
        self.rt = runner.runtime()
        self.store = BatchStore(self.rt.files)
        self.lost = False  # another runner took the batch over (this one stalled past its lease)
        self.answers = _Answers(self.store, record)

    async def carry_out(self) -> None:
        lines = await self._lines()
        if lines is None:
            return
        if self.batch["status"] == "in_progress":
            await self._serve(lines)
        if not self.lost:
            await self._finish(lines)

    async def _lines(self) -> list[Line] | None:
        """The input file's lines, checked as they are read; a batch whose file fails the
        checks fails, naming them."""
        owner = self.record["owner"]
        try:
            pieces = await self.rt.files.content(owner, self.batch["input_file_id"])
        except NotFound:  # its owner deleted it before the batch was done with it
            await self._input_gone()
            return None
        check = LineCheck(self.batch["endpoint"])
        async for raw in _split(pieces):
            if not check.feed(raw):
                break
        checked = check.done()
        if self.batch["status"] == "validating":
            if checked.error_count:
                await self._invalid(checked)
                return None
            self.batch["request_counts"]["total"] = len(checked.lines)
            await self._enter("in_progress")
        return checked.lines

    async def _enter(self, status: str) -> None:
        """The batch moves to `status` (its `<status>_at` set), saved."""
        self.batch["status"] = status
        self.batch[f"{status}_at"] = now()  # type: ignore[literal-required]  # a *_at field
        self.rt.metrics.batch_status(status)
        await self.store.save(self.record)

    async def _serve(self, lines: list[Line]) -> None:
        """Every line without a stored answer, by as many workers as lines may be in flight;
        each line taken once."""
        done = await self.store.finished(self.record)
        todo = iter([line for line in lines if line.number not in done])
        stop = asyncio.Event()
        n = self.rt.config.batches.max_concurrency
        workers = [asyncio.create_task(self._work(todo, stop)) for _ in range(n)]
        watch = asyncio.create_task(self._watch_status(stop, workers))
        try:
            outcomes = await asyncio.gather(*workers, return_exceptions=True)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        for outcome in outcomes:  # a worker stopped by the window's end is not a failure
            if isinstance(outcome, Exception):
                raise outcome

    async def _work(self, todo: Iterator[Line], stop: asyncio.Event) -> None:
        for line in todo:
            async with self.runner.line_slot():
                if stop.is_set():
                    return
                await self._line(line)

    async def _line(self, line: Line) -> None:
        request_id = f"req_{self.runner.next_id()}"
        status, body = await self._answer(line, request_id)
        answer = {
            "id": f"batch_req_{self.runner.next_id()}",
            "custom_id": line.custom_id,
            # The body as the gateway wrote it, not parsed and written again.
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        }
        await self.answers.put(line.number, status == 200, orjson.dumps(answer))
        counts = self.batch["request_counts"]
        counts["completed" if status == 200 else "failed"] += 1
        self.rt.metrics.batch_line(self.runner.lines[self.batch["endpoint"]][1], status == 200)

    async def _answer(self, line: Line, request_id: str) -> tuple[int, orjson.Fragment]:
        """The line served as its key's live request would be: its status and JSON body. A rate
        limit makes it wait and try again."""
        serve, operation = self.runner.lines[self.batch["endpoint"]]
        body = line.body()
        if body.get("stream"):
            refused = InvalidRequest("A batch's requests cannot stream.", param="stream")
            return refused.status, orjson.Fragment(orjson.dumps(refused.body()))
        while True:
            rt = self.runner.runtime()
            principal = rt.auth.principal(self.record["key_id"])
            if principal is None:
                gone = NotFound("The batch's API key is no longer configured.", param="key")
                return gone.status, orjson.Fragment(orjson.dumps(gone.body()))
            captured = _Captured()
            reply = Reply(captured.send)
            inbound = Inbound(
                rt, "POST", self.batch["endpoint"], {}, request_id, self.runner.ids,
                caller_stays, background=True, batch=(self.batch["id"], line.custom_id),
            )  # fmt: skip
            record = RequestRecord(time.perf_counter(), operation=operation)
            try:
                await serve(inbound, reply, record, principal, orjson.dumps(body))
            except RateLimited as limited:
                await asyncio.sleep(_wait_s(limited))
                continue
            except GatewayError as err:
                await reply.error(err)
            except Exception as exc:
                log.exception("batch line %s failed", line.number)
                await reply.error(internal(exc))
            return captured.status, orjson.Fragment(captured.body or b"null")

    async def _watch_status(self, stop: asyncio.Event, workers: list[asyncio.Task[None]]) -> None:
        """Every quarter second: the counts so far saved, and a cancel or the window's end
        stops new lines. The window's end stops the lines in flight too (they are expired)."""
        saved = dict(self.batch["request_counts"])
        renewed = time.monotonic()
        lease = self.rt.config.batches.lease_s
        while not stop.is_set():
            await asyncio.sleep(0.25)
            if time.monotonic() - renewed >= lease / RENEWALS:
                renewed = time.monotonic()
                name = lease_name(self.record)
                if not await self.runner.leases.renew(name, self.runner.holder, lease):
                    self.lost = True  # another runner has it now: stop, and leave it the rest
                    stop.set()
                    return
            asked = await self.store.cancel_requested(self.record)
            if asked is not None:
                self.batch["status"], self.batch["cancelling_at"] = "cancelling", asked
                self.rt.metrics.batch_status("cancelling")
                stop.set()
            elif time.time() >= self.batch["expires_at"]:
                stop.set()
                for worker in workers:
                    worker.cancel()
            if self.batch["request_counts"] != saved or stop.is_set():
                saved = dict(self.batch["request_counts"])
                await self.store.save(self.record)

    async def _finish(self, lines: list[Line]) -> None:
        """The output and error files from the stored answers, then the batch's last status:
        completed, cancelled, or expired when its window ended first (its lines not run are in
        the error file then, as OpenAI lists them)."""
        status = self.batch["status"]
        expired = status == "in_progress" and time.time() >= self.batch["expires_at"]
        if status == "in_progress" and not expired:
            await self._enter("finalizing")
        output, errors = await self._files(lines if expired else [])
        self.batch["output_file_id"], self.batch["error_file_id"] = output, errors
        await self._enter(
            "expired" if expired else "cancelled" if status == "cancelling" else "completed"
        )

    async def _file_ids(self) -> dict[str, str]:
        """The output and error files' ids, chosen once and saved before either is written."""
        ids = self.record.get("files")
        if ids is None:
            ids = self.record["files"] = {"output": new_file_id(), "error": new_file_id()}
            await self.store.save(self.record)
        return ids

    async def _files(self, expired: list[Line]) -> tuple[str | None, str | None]:
        """The output and error files, streamed from the stored answers (a file is made only if
        it has a line); `expired`: the lines of an expired batch, of which those without an
        answer are listed as expired."""
        ids = await self._file_ids()
        answered: set[int] = set()
        ok = _Counter(self._stored(True, answered))
        output = await self._file(ok, ids["output"], "output")
        failed = _Counter(self._unanswered(expired, answered))
        errors = await self._file(failed, ids["error"], "error")
        counts = self.batch["request_counts"]
        counts["completed"], counts["failed"] = ok.count, failed.count
        return output, errors

    async def _stored(self, succeeded: bool, answered: set[int]) -> AsyncIterator[bytes]:
        """The stored answers that succeeded (or failed), in line order; `answered` gets every
        stored line's number."""
        async for number, ok, answer in self.store.answers(self.record):
            answered.add(number)
            if ok == succeeded:
                yield answer + b"\n"

    async def _unanswered(self, expired: list[Line], answered: set[int]) -> AsyncIterator[bytes]:
        """The failed answers, then the expired lines without one."""
        async for answer in self._stored(False, set()):
            yield answer
        for line in expired:
            if line.number not in answered:
                yield orjson.dumps(self._expired(line)) + b"\n"

    def _expired(self, line: Line) -> dict[str, Any]:
        return {
            "id": f"batch_req_{self.runner.next_id()}",
            "custom_id": line.custom_id,
            "response": None,
            "error": {
                "code": "batch_expired",
                "message": "This request could not be executed before the completion window "
                "expired.",
            },
        }

    async def _file(self, lines: _Counter, file_id: str, kind: str) -> str | None:
        first = await lines.first()
        if first is None:
            return None
        owner = self.record["owner"]
        _, size = await self.rt.files.put(owner, lines.rest(first), file_id)
        name = f"{self.batch['id']}_{kind}.jsonl"
        await self.rt.files.describe(owner, file_object(file_id, size, name, BATCH_OUTPUT, None))
        self.rt.metrics.file_stored(BATCH_OUTPUT, size)
        return file_id

    async def _input_gone(self) -> None:
        """The batch fails, naming its input file; the lines answered before are kept in its
        output and error files (a batch under way, stopped and taken up again, reads its lines
        anew). Failing it, not trying again, is what ends: the file does not come back."""
        if self.batch["status"] == "in_progress":
            self.batch["output_file_id"], self.batch["error_file_id"] = await self._files([])
        file_id = self.batch["input_file_id"]
        gone: LineError = {
            "code": "file_not_found",
            "message": f"The input file {file_id} was deleted before the batch was done with it.",
            "param": "input_file_id",
            "line": None,
        }
        await self._failed([gone], 1)

    async def _invalid(self, checked: Checked) -> None:
        """The input file failed its checks: the batch fails, its object showing the first
        errors and their count, its error file listing every one (the file read and checked
        again: the errors are not held)."""
        ids = await self._file_ids()
        errors = _Counter(self._line_errors())
        self.batch["error_file_id"] = await self._file(errors, ids["error"], "error")
        await self._failed(checked.errors, checked.error_count)

    async def _line_errors(self) -> AsyncIterator[bytes]:
        """Every error of the input file's lines, a line of the error file each, in OpenAI's
        form (`error` is the `errors.data` entry; `custom_id` the line's, if it has one)."""
        try:
            pieces = await self.rt.files.content(self.record["owner"], self.batch["input_file_id"])
        except NotFound:  # deleted since it was checked: the batch's object has what was found
            return
        check = LineCheck(self.batch["endpoint"])
        async for raw in _split(pieces):
            more = check.feed(raw)
            for error in check.fresh:
                yield self._error_line(error, check.custom_id)
            if not more:
                break
        check.done()
        for error in check.fresh:
            yield self._error_line(error, None)

    def _error_line(self, error: LineError, custom_id: str | None) -> bytes:
        line = {
            "id": f"batch_req_{self.runner.next_id()}",
            "custom_id": custom_id,
            "response": None,
            "error": error,
        }
        return orjson.dumps(line) + b"\n"

    async def _failed(self, errors: list[LineError], total: int) -> None:
        self.batch["errors"] = bounded(errors, total)
        await self._enter("failed")


class _Answers:
    """Lines' answers stored together: each line waits for the write that holds its answer (a
    group commit: while one write is out, the answers that finish meanwhile gather for the
    next), so a line is done only once its answer is stored, at one write for many lines."""

    def __init__(self, store: BatchStore, record: Record) -> None:
        self._store = store
        self._record = record
        self._pending: list[tuple[Answer, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def put(self, number: int, ok: bool, answer: bytes) -> None:
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(((number, ok, answer), stored))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await asyncio.shield(stored)  # a line cancelled while waiting leaves the write alone

    async def _write(self) -> None:
        while self._pending:
            taken, self._pending = self._pending, []
            try:
                await self._store.put_answers(self._record, [answer for answer, _ in taken])
            except Exception as exc:
                for _, stored in taken:
                    stored.set_exception(exc)
            else:
                for _, stored in taken:
                    stored.set_result(None)


class _Counter:
    """A file's lines as they are written, counted; `first()` tells whether there is any."""

    def __init__(self, lines: AsyncIterator[bytes]) -> None:
        self._lines = lines
        self.count = 0

    async def first(self) -> bytes | None:
        async for line in self._lines:
            self.count = 1
            return line
        return None

    async def rest(self, first: bytes) -> AsyncIterator[bytes]:
        """The lines, `first` the first, in pieces of about CHUNK bytes (a write per piece)."""
        piece = [first]
        size = len(first)
        async for line in self._lines:
            self.count += 1
            piece.append(line)
            size += len(line)
            if size >= CHUNK:
                yield b"".join(piece)
                piece, size = [], 0
        yield b"".join(piece)


class _Captured:
    """A reply's bytes, kept instead of sent."""

    def __init__(self) -> None:
        self.status = 0
        self.body = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


async def _split(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A file's lines as its pieces arrive (a line may span pieces)."""
    rest = b""
    async for piece in pieces:
        *whole, rest = (rest + piece).split(b"\n")
        for line in whole:
            yield line
    yield rest


def _wait_s(limited: RateLimited) -> float:
    raw = limited.headers.get("retry-after")
    return float(raw) if raw and raw.replace(".", "", 1).isdigit() else RATE_LIMIT_WAIT_S
