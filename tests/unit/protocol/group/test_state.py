"""The group state machine (``controller/protocol/group/state.py``): every pair of states, legal or not.

The legal transitions are written out here from Kafka's GroupMetadata (CompletingRebalance is our
AwaitingSync), not read back from the module's table.
"""

from __future__ import annotations

from itertools import product

import pytest

from controller.protocol.group.state import VALID_PREVIOUS, GroupState, IllegalTransition, check_transition

S = GroupState
LEGAL = {
    (S.STABLE, S.PREPARING_REBALANCE),
    (S.AWAITING_SYNC, S.PREPARING_REBALANCE),
    (S.EMPTY, S.PREPARING_REBALANCE),
    (S.PREPARING_REBALANCE, S.AWAITING_SYNC),
    (S.AWAITING_SYNC, S.STABLE),
    (S.PREPARING_REBALANCE, S.EMPTY),
    (S.STABLE, S.DEAD),
    (S.PREPARING_REBALANCE, S.DEAD),
    (S.AWAITING_SYNC, S.DEAD),
    (S.EMPTY, S.DEAD),
    (S.DEAD, S.DEAD),
    # reconcile (KIP-848's Assigning/Reconciling folded into one): entered from a join round that chose it,
    # Stable <-> Reconciling as targets change and are reached, back to a join round for a member without it
    (S.PREPARING_REBALANCE, S.RECONCILING),
    (S.STABLE, S.RECONCILING),
    (S.RECONCILING, S.STABLE),
    (S.RECONCILING, S.PREPARING_REBALANCE),
    (S.RECONCILING, S.DEAD),
}

# --------------------------------------------------------------------------------------------------
# the state machine
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("current, target", list(product(GroupState, GroupState)), ids=lambda s: s.value)
def test_every_transition(current: GroupState, target: GroupState):
    if (current, target) in LEGAL:
        check_transition(current, target)
    else:
        with pytest.raises(IllegalTransition, match=f"{current.value} to {target.value}"):
            check_transition(current, target)


def test_table_matches_kafka():
    assert {(p, t) for t, ps in VALID_PREVIOUS.items() for p in ps} == LEGAL
    assert set(VALID_PREVIOUS) == set(GroupState)
