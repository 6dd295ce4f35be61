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
- Ensembles do not carry a chain through their steps (a cycle through an ensemble is not detected).
"""

from __future__ import annotations

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


def reentry_refusal(model: str, version: str, instances: int, chain: CallChain) -> str | None:
    """Why a request to ``model`` (``instances`` of it) with ``chain`` is refused: every instance of the model
    waits for its answer; None when one is off the chain (or the model is not on it)."""
    waiting = {index for name, known, index in chain if name == model and known == version}
    if not waiting or len(waiting) < instances:
        return None
    caller = chain[-1][0]
    path = " -> ".join(f"'{name}'" for name, _, _ in chain) + f" -> '{model}'"
    if caller == model:
        head = f"model '{model}' sent a BLS request to itself"
    else:
        head = f"model '{caller}' sent a BLS request to model '{model}' that waits for itself ({path})"
    count = "its one instance is" if instances == 1 else f"all {instances} of its instances are"
    return (
        f"{head}: refused, {count} running a request that waits for this one's answer (a deadlock); "
        f"give '{model}' another instance (instance_group count) or break the cycle"
    )


def off_chain(entry: object, chain: CallChain) -> bool:
    """Whether an instance (its ``chain_entry``, or None for one that makes no calls) may run a request with
    ``chain``."""
    return not chain or entry is None or entry not in chain
