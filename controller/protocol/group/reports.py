"""Members' words, checked, sans-IO: the coordinator trusts ZooKeeper, not what a member znode says.

A member znode is untrusted input twice over. Anyone who may write under ``/groups/<g>/members`` can create
one (a ghost: no broker behind it), and a live broker's request can be rewritten or be simply wrong. So:

* a member counts only when its znode is held by the session that holds the broker registration of the
  same id (``ghost_reason``): the registration is the broker, and one session holds both;
* every field of a request is bounded (``request_problem``), and a report may not name a member epoch the
  coordinator never published (``report_problem``); a refused report is answered (``INVALID_REPORT``,
  the member rewrites it), never dropped in silence;
* what a report lists as owned can narrow what the member is counted as holding, never claim a task that
  the coordinator placed with another member (``narrow_owned``): the owner znodes decide who runs a task.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.protocol.cluster.layout import check_name
from controller.protocol.records.group_messages import JoinRequest

#: bounds of a join request's fields (a member runs at most this many tasks; names are path segments)
MAX_OWNED = 100_000
MAX_NAMES = 16
MAX_TEXT = 200
MAX_CAPACITY = 1_000_000
#: epochs and generations stay within what every JSON reader keeps exact (2^53)
MAX_GENERATION = 2**53


def session_text(session: int | None) -> str:
    return "none" if session is None else f"0x{session:x}"


def ghost_reason(member: str, member_session: int | None, broker_session: int | None, registered: bool) -> str:
    """Why a member znode has no live broker behind it ("" when it has one): the same session must hold the
    member znode and the broker registration of the same id."""
    if not registered:
        return f"no registered broker {member}"
    if member_session is None or member_session == 0:
        return f"member znode of {member} is not ephemeral"
    if member_session != broker_session:
        return (
            f"member znode of {member} is held by session {session_text(member_session)}, "
            f"not by the broker's {session_text(broker_session)}"
        )
    return ""


def request_problem(req: JoinRequest) -> str:
    """What is out of bounds in a request ("" when nothing is): names, list sizes, numbers."""
    try:
        check_name("member id", req.member_id)
        if len(req.owned) > MAX_OWNED:
            return f"owned lists {len(req.owned)} tasks, over {MAX_OWNED}"
        for t in req.owned:
            check_name("task id", t)
        if not set(req.pending) <= set(req.owned):
            return "pending lists a task that owned does not"
        if not set(req.starting) <= set(req.owned) - set(req.pending):
            return "starting lists a task that is not owned, or is pending"
    except ValueError as exc:
        return str(exc)
    if len(set(req.owned)) != len(req.owned):
        return "owned lists a task twice"
    for name, values in (("protocols", req.protocols), ("assignors", req.assignors)):
        if len(values) > MAX_NAMES or any(not v or len(v) > MAX_TEXT for v in values):
            return f"{name}: at most {MAX_NAMES} names of 1-{MAX_TEXT} characters"
    for name, text in (("rack", req.rack), ("instance_id", req.instance_id), ("incarnation", req.incarnation)):
        if text is not None and not 0 < len(text) <= MAX_TEXT:
            return f"{name}: 1-{MAX_TEXT} characters"
    if not 1 <= req.capacity <= MAX_CAPACITY:
        return f"capacity {req.capacity} is not within 1-{MAX_CAPACITY}"
    for name, value in (("generation", req.generation), ("join_generation", req.join_generation)):
        if not -1 <= value <= MAX_GENERATION:
            return f"{name} {value} is not within -1..2^53"
    return ""


def report_problem(req: JoinRequest, published: int) -> str:
    """What is wrong with a reconciling member's report ("" when nothing is): a bound broken, or a member
    epoch above ``published``, the newest the coordinator ever published (no member reconciled to it)."""
    problem = request_problem(req)
    if problem:
        return problem
    if req.generation > published:
        return f"generation {req.generation} was never published (newest {published})"
    if req.join_generation > published + 1:
        return f"join_generation {req.join_generation} is past the next generation ({published + 1})"
    return ""


def narrow_owned(
    owned: Mapping[str, tuple[str, ...]], placed: Mapping[str, Mapping[str, object] | tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """Each member's ``owned`` without the tasks the coordinator placed with another member (``placed``:
    member -> the tasks published to it or revoked from it and not yet released). A member's word narrows
    what it holds; it never takes a task from another live owner (its owner znode fences it anyway)."""
    elsewhere: dict[str, str] = {}
    for m, ts in placed.items():
        for t in ts:
            elsewhere.setdefault(t, m)
    out: dict[str, tuple[str, ...]] = {}
    for m, ts in owned.items():
        mine = placed.get(m, ())
        out[m] = tuple(t for t in ts if elsewhere.get(t, m) == m or t in mine)
    return out
