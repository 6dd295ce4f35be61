"""BLS call chains: which model instances wait for a request's answer, and the re-entry that would wedge them.

Rules:
- A Python model's instance that makes a BLS call while it runs requests waits for the call's answer.  The
  call's chain is the chains of the requests that instance holds (their callers wait too) and the instance
  itself, last: ``(model, version, instance index)`` each.  The server builds it from what it knows the
  instance holds (never from what a worker says: a worker cannot shorten its chain).
- A request whose model has every instance on its chain would wait for itself (Triton has no such check: its
  request waits for good).  The Core refuses it before it starts (:func:`reentry_refusal`); one with an
  instance off the chain runs there (the direct scheduler never hands it to an instance on its chain: a
  worker runs its requests one after the other, so it would wait behind the request that waits for it).
- Two requests may enter one cycle from different models at once (a -> b beside b -> a): neither chain holds
  the other's instance.  The Core's :class:`WaitGraph` knows every BLS call in flight (which instance waits on
  which model): an instance whose call waits on a model every instance of which waits for this request counts
  as waiting for it too, and a request whose model has every instance so is refused.  Check and registration
  are one step under one lock: of two such calls, the second is refused.
- Ensembles do not carry a chain through their steps (a cycle through an ensemble is not detected).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

#: ``(model, version, instance index)`` of one Python model instance.
ChainEntry = tuple[str, str, int]
#: The instances a BLS request's answer is awaited by, outermost first (empty for a client's request).
CallChain = tuple[ChainEntry, ...]


def chain_of_call(entry: ChainEntry, held: Iterable[CallChain]) -> CallChain:
    """The chain of a BLS call that instance ``entry`` makes while it holds requests with the chains ``held``."""
    seen: dict[ChainEntry, None] = {}
    for chain in held:
        for link in chain:
            seen[link] = None
    seen.pop(entry, None)
    seen[entry] = None
    return tuple(seen)


def reentry_refusal(
    model: str, version: str, instances: int, chain: CallChain, waiting: frozenset[ChainEntry] | None = None
) -> str | None:
    """Why a request to ``model`` (``instances`` of it) with ``chain`` is refused: every instance of the model
    waits for its answer (is on the chain, or in ``waiting``: see :class:`WaitGraph`); None when one does not."""
    on_chain = {index for name, known, index in chain if name == model and known == version}
    behind = {index for name, known, index in waiting or () if name == model and known == version}
    if len(on_chain | behind) < instances or not instances:
        return None
    caller = chain[-1][0]
    count = "its one instance is" if instances == 1 else f"all {instances} of its instances are"
    advice = f"give '{model}' another instance (instance_group count) or break the cycle"
    if len(on_chain) < instances:  # (some wait through another request's BLS call)
        return (
            f"model '{caller}' sent a BLS request to model '{model}': refused, {count} running a request whose "
            f"own BLS call waits for this one's caller (two requests entered one cycle from both ends: a "
            f"deadlock); {advice}"
        )
    if caller == model:
        head = f"model '{model}' sent a BLS request to itself"
    else:
        path = " -> ".join(f"'{name}'" for name, _, _ in chain) + f" -> '{model}'"
        head = f"model '{caller}' sent a BLS request to model '{model}' that waits for itself ({path})"
    return f"{head}: refused, {count} running a request that waits for this one's answer (a deadlock); {advice}"


class WaitGraph:
    """One Core's BLS calls in flight: which instance waits on which model (see the module's rules)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Per calling instance: the models it has calls in flight to, with how many.
        self._calls: dict[ChainEntry, dict[tuple[str, str], int]] = {}
        #: Each called model's instance count (as it was when called).
        self._counts: dict[tuple[str, str], int] = {}

    def enter(self, model: str, version: str, instances: int, chain: CallChain) -> str | None:
        """Why a BLS request to ``model`` with ``chain`` is refused, or None: it is counted in flight
        (:meth:`leave` when it ends)."""
        key = (model, version)
        with self._lock:
            self._counts[key] = instances
            refusal = reentry_refusal(model, version, instances, chain, self._waiting_for(chain))
            if refusal is None:
                calls = self._calls.setdefault(chain[-1], {})
                calls[key] = calls.get(key, 0) + 1
            return refusal

    def leave(self, model: str, version: str, chain: CallChain) -> None:
        """The BLS request that :meth:`enter` let in ended."""
        key = (model, version)
        with self._lock:
            calls = self._calls.get(chain[-1])
            if calls is None or key not in calls:
                return
            calls[key] -= 1
            if not calls[key]:
                del calls[key]
                if not calls:
                    del self._calls[chain[-1]]

    def _waiting_for(self, chain: CallChain) -> frozenset[ChainEntry]:
        """The instances that wait for a request with ``chain`` (the lock is held): those on the chain, and each
        with a call in flight to a model whose every instance waits for it, until no more are found."""
        waiting = set(chain)
        while True:
            indexes: dict[tuple[str, str], set[int]] = {}
            for name, version, index in waiting:
                indexes.setdefault((name, version), set()).add(index)
            # the models that cannot answer before this request does (a call to one waits for it)
            stuck = {key for key, held in indexes.items() if 0 < self._counts.get(key, 0) <= len(held)}
            if not stuck:
                return frozenset(waiting)
            found = [caller for caller, models in self._calls.items()
                     if caller not in waiting and not stuck.isdisjoint(models)]
            if not found:
                return frozenset(waiting)
            waiting.update(found)


def off_chain(entry: object, chain: CallChain) -> bool:
    """Whether an instance (its ``chain_entry``, or None for one that makes no calls) may run a request with
    ``chain``."""
    return not chain or entry is None or entry not in chain
