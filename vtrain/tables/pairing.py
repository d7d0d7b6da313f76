"""Point-to-point transfers without a named pair of ranks: which rank's sends a rank receives (see
:mod:`vtrain.tables.matching`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import permutations

from vtrain.tables.calls import Call, by_iteration_and_label, classes, ordered, pair_in_order

#: most ranks per pipeline stage whose transfers are assigned by trying every one-to-one assignment
MAX_REPLICAS = 8


def match_point_to_point(calls: list[Call], source: str) -> None:
    """Sends and receives without a named pair of ranks: find each receiver's sender, then pair their calls."""
    for same_size in classes(calls, lambda c: (c.on_cpu, c.nbytes)).values():
        sends = [c for c in same_size if c.kind == "send"]
        recvs = [c for c in same_size if c.kind == "recv"]
        for channel_sends, channel_recvs in _channels(sends, recvs):
            pair_in_order(channel_sends, channel_recvs, source)


_Link = tuple[dict[int, list[Call]], dict[int, list[Call]]]  # sender -> sends, receiver -> receives


def _channels(sends: list[Call], recvs: list[Call]) -> list[tuple[list[Call], list[Call]]]:
    """The (sends, receives) of each sender -> receiver channel that can be told.

    With ``vtrain/comm`` spans, transfers are grouped by the pair of stages they link; a send belongs to the link
    from its span's stage to its peer's, a receive to the link from its peer stage to its own. When a stage has
    several ranks (tensor- or data-parallel replicas) the ranks of the two stages are paired one to one (a pair
    exchanges the transfers both ways, activations and their gradients), as the pairing under which no receive
    completed before its send was posted (on a shared clock). Without spans, a receiver's sender must be the
    only other rank sending transfers of that size.
    """
    links: dict[tuple[str | None, str | None], _Link] = defaultdict(lambda: (defaultdict(list), defaultdict(list)))
    for send in sends:
        links[(send.stage, send.peer)][0][send.rank].append(send)
    for recv in recvs:
        links[(recv.peer, recv.stage)][1][recv.rank].append(recv)
    channels = []
    for key in {tuple(sorted(key, key=str)) for key in links}:
        if None in key:  # no spans: a receiver's sender must be the only other rank sending this size
            senders, receivers = links[key]
            for receiver, received in receivers.items():
                others = set(senders) - {receiver}
                if len(others) == 1:
                    channels.append((senders[others.pop()], received))
            continue
        there, back = links.get(key, ({}, {})), links.get(key[::-1], ({}, {}))
        for a, b in _pair(there, back).items():
            for (senders, receivers), (src, dst) in ((there, (a, b)), (back, (b, a))):
                if src in senders and dst in receivers:
                    channels.append((senders[src], receivers[dst]))
    return channels


def _pair(there: _Link, back: _Link) -> dict[int, int]:
    """Rank of one stage -> rank of the other: among the one-to-one pairings where every receive (both ways)
    completed after its send was posted, the one where most receives completed right after their own send (no
    other candidate's send posted in between); empty when there is none or no single best one."""
    ours = sorted(set(there[0]) | set(back[1]))
    theirs = sorted(set(there[1]) | set(back[0]))
    if len(ours) != len(theirs) or len(ours) > MAX_REPLICAS or set(ours) & set(theirs):
        return {}
    causal = {(a, b): _causal(there[0].get(a, []), there[1].get(b, []))
              and _causal(back[0].get(b, []), back[1].get(a, [])) for a in ours for b in theirs}
    feasible = [order for order in permutations(theirs) if all(causal[(a, b)] for a, b in zip(ours, order))]
    if len(feasible) > 1:
        votes = _last_posted(*there) + Counter({(a, b): n for (b, a), n in _last_posted(*back).items()})
        score = {order: sum(votes[(a, b)] for a, b in zip(ours, order)) for order in feasible}
        best = max(score.values())
        feasible = [order for order in feasible if score[order] == best]
    return dict(zip(ours, feasible[0])) if len(feasible) == 1 else {}


def _last_posted(senders: dict[int, list[Call]], receivers: dict[int, list[Call]]) -> Counter[tuple[int, int]]:
    """(sender, receiver) -> how many of the receiver's calls completed with that sender's matching send the last
    one posted before it (the sender it was most likely waiting for)."""
    votes: Counter[tuple[int, int]] = Counter()
    for receiver, received in receivers.items():
        for recv in received:
            posted = [(send.arrival, rank) for rank, sent in senders.items() for send in sent
                      if send.iteration == recv.iteration and send.label == recv.label and send.arrival <= recv.end]
            if posted:
                votes[(max(posted)[1], receiver)] += 1
    return votes


def _causal(sent: list[Call], received: list[Call]) -> bool:
    """Whether each receive, paired in order per iteration and label, completed after its send was posted."""
    for mine, theirs in by_iteration_and_label(sent, received):
        if len(mine) != len(theirs):
            return False
        for send, recv in zip(*ordered((mine, theirs))):
            if recv.end < send.arrival:
                return False
    return True


