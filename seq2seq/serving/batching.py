"""Dynamic batching: requests from concurrent clients decoded together.

A request becomes a job of a few sentences with a key (its decoding options): jobs that share
a key can share a batch. The first job to arrive opens a batch and waits up to `wait_s` for
others, until `max_sentences` are in; the batch's jobs are then decoded group by group (one
group per key) on one worker thread, off the event loop, while the next jobs queue. A group
function returns one result per job, or an exception for a job, which only that job's client
receives. A job whose client has gone (a timeout) is skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    key: Hashable  # jobs with equal keys may be decoded together
    work: Any  # what the group function reads
    size: int  # sentences
    future: asyncio.Future = field(repr=False)


GroupFunction = Callable[[list[Job]], list[Any]]  # a result or an exception per job


def decoding_thread() -> ThreadPoolExecutor:
    """The one thread that runs the model. Torch work from two threads slows both on a few
    cores (each thread gets its own OpenMP team, and the teams compete), so the server loads
    the model on this thread too (docs/serving.md)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")


class Batcher:
    def __init__(
        self,
        decode_group: GroupFunction,
        max_sentences: int,
        wait_s: float,
        worker: ThreadPoolExecutor | None = None,
    ) -> None:
        self.decode_group = decode_group
        self.max_sentences, self.wait_s = max_sentences, wait_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.worker = worker or decoding_thread()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.worker.shutdown(wait=True)

    async def submit(self, key: Hashable, work: Any, size: int) -> Any:
        """The job's result, once its batch is decoded."""
        job = Job(key, work, size, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def collect(self) -> list[Job]:
        """The next batch: the first job, then whatever arrives within the wait."""
        batch = [await self.queue.get()]
        size, deadline = batch[0].size, time.monotonic() + self.wait_s
        while size < self.max_sentences:
            left = deadline - time.monotonic()
            try:
                job = (
                    self.queue.get_nowait()
                    if left <= 0
                    else await asyncio.wait_for(self.queue.get(), left)
                )
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
            batch.append(job)
            size += job.size
        return batch

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [job for job in await self.collect() if not job.future.done()]
            groups: dict[Hashable, list[Job]] = {}
            for job in batch:
                groups.setdefault(job.key, []).append(job)
            for jobs in groups.values():
                try:
                    results = await loop.run_in_executor(self.worker, self.decode_group, jobs)
                except Exception as e:  # the group function failed as a whole: all its jobs
                    results = [e] * len(jobs)
                for job, result in zip(jobs, results, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(result, BaseException):
                        job.future.set_exception(result)
                    else:
                        job.future.set_result(result)
