"""Group-limited routing (DeepSeek's n_group / topk_group): the expected number of ranks or nodes a token's
experts lie on, checked against closed forms and a Monte Carlo of the router; validation and serialisation
of the routing keys."""

from __future__ import annotations

import math
import random

import pytest

from conftest import MOE
from learnedperf.errors import SpecError
from learnedperf.specs import ModelSpec

# 16 experts of MOE's shape, top-4
MOE16 = dict(MOE, num_experts=16, moe_top_k=4)


def routing_monte_carlo(m: ModelSpec, parts: int, n: int = 20000, seed: int = 0) -> float:
    """Mean number of parts a token's experts lie on, drawing the routing the docstring describes."""
    rng = random.Random(seed)
    E, k, G, M = m.num_experts, m.moe_top_k, m.moe_router_num_groups, m.moe_router_group_topk
    total = 0
    for _ in range(n):
        chosen = [e for g in rng.sample(range(G), M) for e in range(g * E // G, (g + 1) * E // G)]
        total += len({e * parts // E for e in rng.sample(chosen, k)})
    return total / n


@pytest.mark.parametrize("groups, group_topk, parts", [
    (1, 1, 2), (1, 1, 8), (8, 4, 8), (8, 4, 2), (8, 4, 16), (8, 4, 64), (8, 3, 4), (4, 2, 8)])
def test_expected_parts_match_a_monte_carlo_of_the_routing(groups, group_topk, parts):
    # DeepSeek-V3's router: 256 experts, top-8, in 8 groups of which a token uses 4 (node-limited routing)
    m = ModelSpec.parse(dict(MOE, num_experts=256, moe_top_k=8, moe_router_num_groups=groups,
                             moe_router_group_topk=group_topk))
    assert m.expected_parts_per_token(parts) == pytest.approx(routing_monte_carlo(m, parts), abs=0.04)


def test_expected_parts_closed_forms():
    free = ModelSpec.parse(MOE16)
    assert free.expected_parts_per_token(1) == 1.0
    assert free.expected_parts_per_token(16) == pytest.approx(4.0)  # one expert a part: its top-4, always distinct
    # two halves, 8 experts each: a token misses a half with probability C(8, 4) / C(16, 4)
    assert free.expected_parts_per_token(2) == pytest.approx(2 * (1 - math.comb(8, 4) / math.comb(16, 4)))
    # one group of two: every token stays in one node, whatever the routing
    limited = ModelSpec.parse(dict(MOE16, moe_router_num_groups=2, moe_router_group_topk=1))
    assert limited.expected_parts_per_token(2) == pytest.approx(1.0)
    # groups that neither nest in nor split evenly over the parts count as no limit (an upper bound)
    odd = ModelSpec.parse(dict(MOE, num_experts=48, moe_top_k=4, moe_router_num_groups=3, moe_router_group_topk=1))
    bound = ModelSpec.parse(dict(MOE, num_experts=48, moe_top_k=4))
    assert odd.expected_parts_per_token(2) == bound.expected_parts_per_token(2)
    assert odd.expected_parts_per_token(2) >= routing_monte_carlo(odd, 2)


@pytest.mark.parametrize("model, field", [
    (dict(MOE16, moe_router_num_groups=3), "moe_router_num_groups"),
    (dict(MOE16, moe_router_num_groups=4, moe_router_group_topk=5), "moe_router_group_topk"),
    (dict(MOE16, moe_router_num_groups=8, moe_router_group_topk=1), "moe_router_group_topk"),  # 2 experts < top-4
    (dict(MOE, arch="llama", num_experts=1, moe_top_k=1, moe_router_num_groups=2), "moe_router_num_groups"),
    (dict(MOE, arch="llama", num_experts=1, moe_top_k=1, moe_router_group_topk=2), "moe_router_group_topk")])
def test_impossible_routing_names_the_field(model, field):
    with pytest.raises(SpecError) as err:
        ModelSpec.parse(model)
    assert err.value.field == field


def test_routing_groups_serialise_only_when_set():
    plain = ModelSpec.parse(MOE16)
    assert plain.moe_router_group_topk == 1
    assert "moe_router_num_groups" not in plain.to_dict() and "moe_router_group_topk" not in plain.to_dict()
    grouped = ModelSpec.parse(dict(MOE16, moe_router_num_groups=4))
    assert grouped.moe_router_group_topk == 4  # no limit unless stated
    assert "moe_router_group_topk" not in grouped.to_dict()
    limited = ModelSpec.parse(dict(MOE16, moe_router_num_groups=4, moe_router_group_topk=2))
    assert ModelSpec.parse(limited.to_dict()) == limited


def test_huggingface_greedy_routing_ignores_the_groups():
    from test_mla import HF_V3

    assert ModelSpec.from_hf_config(HF_V3, 4096).moe_router_group_topk == 4
    greedy = ModelSpec.from_hf_config(dict(HF_V3, topk_method="greedy"), 4096)
    assert (greedy.moe_router_num_groups, greedy.moe_router_group_topk) == (1, 1)
