"""Which evaluator times which candidate: a task's home evaluator times its reference (tasks spread round-robin);
its candidates go to whichever evaluator of the home's device class has room, the least busy first (the home on
a tie). Every candidate is timed against the reference interleaved on the device it runs on, so its speedup never
mixes two devices, and identical GPUs share the whole campaign's work instead of each serving a fixed share of the
tasks (one GPU idling while the other has a queue).

An evaluator has room while it holds fewer than ``window`` evaluations: a small window keeps the choice late (a
candidate goes to the GPU that frees up first); a backend that builds in a compile pool takes a large one, so its
builds start at once and overlap the device's work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")


class EvalDispatch(Generic[Item]):
    def __init__(self, window: int) -> None:
        self.window = max(1, window)
        self.home: dict[str, int] = {}  # task -> the evaluator that timed its reference
        self.peers: dict[str, list[int]] = {}  # task -> the evaluators that may time its candidates, home first
        self.load: list[int] = []  # evaluations outstanding on each evaluator
        self.queue: deque[tuple[str, Item]] = deque()  # candidates waiting for an evaluator with room
        self.paused: set[int] = set()  # evaluators restarting: nothing is sent to them until they are back

    def place(self, tasks: Sequence[str], evaluators: int) -> None:
        """Give each task a home evaluator (round-robin), where its reference is timed; until :meth:`share`
        says which evaluators are alike, its candidates go there too."""
        self.load = [0] * evaluators
        for k, name in enumerate(tasks):
            self.home[name] = k % evaluators
            self.peers[name] = [k % evaluators]

    def share(self, classes: Sequence[str]) -> None:
        """The evaluators' device classes: a task's candidates may go to any evaluator of its home's class."""
        for name, home in self.home.items():
            self.peers[name] = [home] + [i for i, c in enumerate(classes) if i != home and c == classes[home]]

    def put(self, task: str, item: Item) -> None:
        self.queue.append((task, item))

    def ready(self) -> list[tuple[int, Item]]:
        """The waiting candidates that can be sent now, oldest first, each with its evaluator (counted busy)."""
        sent: list[tuple[int, Item]] = []
        waiting: deque[tuple[str, Item]] = deque()
        for task, item in self.queue:
            room = [i for i in self.peers[task] if self.load[i] < self.window and i not in self.paused]
            if not room:
                waiting.append((task, item))
                continue
            which = min(room, key=self.load.__getitem__)  # min keeps the first (the home) on a tie
            self.load[which] += 1
            sent.append((which, item))
        self.queue = waiting
        return sent

    def pause(self, which: int) -> None:
        """``which`` died and is restarting: its candidates wait (or go to a peer) until :meth:`resume`."""
        self.paused.add(which)

    def resume(self, which: int) -> None:
        self.paused.discard(which)

    def done(self, which: int) -> None:
        """An evaluation on ``which`` finished (or failed)."""
        self.load[which] -= 1

    @property
    def running(self) -> int:
        return sum(self.load)
