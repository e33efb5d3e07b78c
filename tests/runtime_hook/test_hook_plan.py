"""runtime_hook.plan: which containers get a share, which are refused, which pass untouched."""

from __future__ import annotations

import json

import pytest

from egpu import card_roster
from egpu.card_roster import RosterEntry, owner_id, share_owner
from egpu.contract import (
    ENV_ALLOCATION_ERROR,
    ENV_CONTAINER,
    ENV_DEVICES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_POD_UID,
    claim_mark_path,
)
from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares
from runtime_hook.oci import parse_spec
from runtime_hook.plan import (
    Apply,
    Inputs,
    Refuse,
    Skip,
    card_shares,
    claim_requests,
    decide,
    identify,
    preload_text,
)

U0, U1 = "GPU-aaaa", "GPU-bbbb"
ANN = {"io.kubernetes.cri.sandbox-uid": "uid-a", "io.kubernetes.cri.container-name": "main",
       "io.kubernetes.cri.sandbox-name": "pa", "io.kubernetes.cri.sandbox-namespace": "ns"}


def shares(*cards: str, container: str = "main", uid: str = "uid-a",
           priority: str = "high", policy: str = "strict", floor: int = 0) -> PodShares:
    entry = ContainerAllocation(container, False, tuple(
        CardShare(u, i, 4096, 30 + 10 * i) for i, u in enumerate(cards)))
    return PodShares("ns", "pa", uid, priority, policy, False,
                     Allocation(containers=(entry,), node="n1"), floor)


def test_named_container_with_matching_devices_gets_its_config() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": f"{U1},{U0}", ENV_DEVICES: "x"}
    result = decide(Inputs("c1", env, ANN, shares(U0, U1)))
    assert isinstance(result, Apply)
    assert result.dir_name == "uid-a_main"
    assert result.config is not None
    assert [c.uuid for c in result.config.cards] == [U0, U1]
    assert result.config.container_region == "/var/run/egpu/containers/uid-a_main/region"
    assert result.config.cards[0].card_region == f"/var/run/egpu/cards/{U0}"
    assert result.config.cards[0].memory_mib == 4096


def test_cri_o_annotations_name_the_container_too() -> None:
    ann = {"io.kubernetes.pod.uid": "uid-a", "io.kubernetes.container.name": "main"}
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0}, ann, shares(U0)))
    assert isinstance(result, Apply)


def test_wrong_cards_are_refused_never_another_share() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": U1, ENV_DEVICES: "x"}
    result = decide(Inputs("c1", env, ANN, shares(U0)))
    assert isinstance(result, Refuse)
    assert "does not match its allocation" in result.message and U0 in result.message


def test_allocation_error_from_the_device_plugin_is_refused_with_its_message() -> None:
    env = {ENV_ALLOCATION_ERROR: "no pod bound waits for a share on cards X", ENV_DEVICES: "x"}
    result = decide(Inputs("c1", env, ANN, shares(U0)))
    assert isinstance(result, Refuse) and "no pod bound waits" in result.message


def test_devices_without_any_identity_are_ambiguous_and_refused() -> None:
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x"}, {}))
    assert isinstance(result, Refuse) and "ambiguous" in result.message


def test_device_plugin_env_names_the_container_when_annotations_are_missing() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x", ENV_POD_UID: "uid-a",
           ENV_CONTAINER: "main"}
    assert identify(env, {}) == ("uid-a", "main")
    assert isinstance(decide(Inputs("c1", env, {}, shares(U0))), Apply)


def test_devices_but_no_allocation_file_is_refused() -> None:
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x"}, ANN, None))
    assert isinstance(result, Refuse) and "node-agent" in result.message


def test_container_without_share_is_untouched() -> None:
    assert isinstance(decide(Inputs("c1", {"PATH": "/bin"}, ANN, None)), Skip)
    other = {**ANN, "io.kubernetes.cri.container-name": "sidecar"}
    assert isinstance(decide(Inputs("c1", {}, other, shares(U0))), Skip)
    assert isinstance(decide(Inputs("c1", {}, {})), Skip)


def test_sandbox_is_untouched() -> None:
    ann = {**ANN, "io.kubernetes.cri.container-type": "sandbox"}
    assert isinstance(decide(Inputs("c1", {ENV_DEVICES: "x"}, ann, shares(U0))), Skip)


def test_unreadable_allocation_file_is_refused() -> None:
    result = decide(Inputs("c1", {}, ANN, None, "bad json"))
    assert isinstance(result, Refuse) and "bad json" in result.message


def test_a_raw_share_gets_a_config_file_like_a_pods() -> None:
    result = decide(Inputs("abc", {ENV_MEMORY_LIMIT_MIB: "1024", "NVIDIA_VISIBLE_DEVICES": U0},
                           {}))
    assert isinstance(result, Apply) and result.dir_name == result.region_name == "abc_raw"
    assert result.config is not None
    assert result.config.container_region == "/var/run/egpu/containers/abc_raw/region"
    assert [(c.uuid, c.memory_mib, c.cores) for c in result.config.cards] == [(U0, 1024, 0)]


def test_pod_name_mismatch_is_refused() -> None:
    ann = {**ANN, "io.kubernetes.cri.sandbox-name": "other"}
    result = decide(Inputs("c1", {"NVIDIA_VISIBLE_DEVICES": U0}, ann, shares(U0)))
    assert isinstance(result, Refuse)


def test_preload_keeps_image_entries_and_adds_ours_once() -> None:
    ours = "/usr/lib/egpu/libegpu_interpose.so"
    assert preload_text(None) == f"{ours}\n".encode()
    text = preload_text(b"/lib/libfoo.so\n")
    assert text == f"/lib/libfoo.so\n{ours}\n".encode()
    assert preload_text(text) == text


# --- what the hook writes into each card's roster ----------------------------------------
def test_a_pods_share_is_registered_with_its_configs_terms() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": f"{U0},{U1}", ENV_DEVICES: "x",
           "EGPU_PRIORITY": "high", "EGPU_CORES": "100"}  # the env's copies decide nothing
    plan = decide(Inputs("c1", env, ANN, shares(U0, U1, priority="low", policy="elastic",
                                                floor=15)))
    assert isinstance(plan, Apply)
    owner = share_owner("uid-a_main")
    assert owner == owner_id("/var/run/egpu/containers/uid-a_main/region")
    assert card_shares(plan) == [
        (U0, RosterEntry(owner, 1, 1, 30, 15, 0, "uid-a_main")),
        (U1, RosterEntry(owner, 1, 1, 40, 15, 0, "uid-a_main"))]


@pytest.mark.parametrize(("env", "terms"), [
    ({}, (0, 0, 0)),
    ({"EGPU_PRIORITY": "low", "EGPU_COMPUTE_POLICY": "elastic", "EGPU_CORES": "25"}, (1, 1, 25)),
    ({"EGPU_CORES": " +40"}, (0, 0, 40)),  # as strtoll reads it
])
def test_a_raw_share_is_registered_with_its_envs_terms_and_own_region(
        env: dict[str, str], terms: tuple[int, int, int]) -> None:
    env = {ENV_MEMORY_LIMIT_MIB: "1024", "NVIDIA_VISIBLE_DEVICES": U0, **env}
    plan = decide(Inputs("abc", env, {}))
    assert isinstance(plan, Apply)
    owner = owner_id("/var/run/egpu/containers/abc_raw/region")
    assert card_shares(plan) == [(U0, RosterEntry(owner, *terms, 0, 0, "abc_raw"))]


@pytest.mark.parametrize(("env", "words"), [
    ({"EGPU_PRIORITY": "urgent"}, "EGPU_PRIORITY=urgent"),
    ({"EGPU_COMPUTE_POLICY": "x"}, "EGPU_COMPUTE_POLICY=x"),
    ({"EGPU_CORES": "101"}, "EGPU_CORES=101"),
    ({"EGPU_CORES": "4_0"}, "EGPU_CORES=4_0"),
    ({"EGPU_MEMORY_PERCENTAGE": "5"}, "not both"),
    ({"EGPU_MEMORY_OVERSUBSCRIPTION": "yes"}, "EGPU_MEMORY_OVERSUBSCRIPTION=yes"),
    ({"NVIDIA_VISIBLE_DEVICES": f"{U0},all"}, "'all' names no card by UUID"),
    ({"NVIDIA_VISIBLE_DEVICES": "0"}, "'0' names no card by UUID"),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, "names no card"),
])
def test_a_raw_share_the_interposer_would_not_run_is_refused_at_creation(
        env: dict[str, str], words: str) -> None:
    """Bad terms (the interposer kept CUDA off) or cards the hook cannot name (the share ran
    uncapped on them) are refused at creation, with the variable."""
    env = {ENV_MEMORY_LIMIT_MIB: "1024", "NVIDIA_VISIBLE_DEVICES": U0, **env}
    result = decide(Inputs("abc", env, {}))
    assert isinstance(result, Refuse) and words in result.message, result


def test_a_raw_share_by_percentage_names_no_mib() -> None:
    env = {"EGPU_MEMORY_PERCENTAGE": "25", "NVIDIA_VISIBLE_DEVICES": U0}
    plan = decide(Inputs("abc", env, {}))
    assert isinstance(plan, Apply) and plan.config is not None
    (card,) = plan.config.cards
    assert (card.memory_mib, card.memory_percentage) == (0, 25)
    text = plan.config.encode()
    assert '"memory_percentage": 25' in text and "memory_mib" not in text


# --- raw containers through egpu's CDI device (docs/containerd.md) ------------------------
CDI_ENV = {"PATH": "/usr/bin", "EGPU_CDI_CARD_0": U0}  # what egpu.io/gpu=0 injects


def test_a_cdi_card_without_share_variables_is_refused_naming_them() -> None:
    """Bug: a container given egpu.io/gpu=<n> through CDI without EGPU_* passed untouched
    (Skip), with /dev/nvidia<n> and no interposer: the whole card, no cap."""
    result = decide(Inputs("ctr1", CDI_ENV, {}))
    assert isinstance(result, Refuse), result
    for name in ("EGPU_MEMORY_LIMIT_MIB", "EGPU_MEMORY_PERCENTAGE", "EGPU_CORES"):
        assert name in result.message


def test_a_raw_shares_cards_come_from_its_cdi_devices() -> None:
    """Bug: CDI sets only EGPU_CDI_CARD_<i>, not NVIDIA_VISIBLE_DEVICES: the hook registered
    no card and mounted no card folder."""
    env = {**CDI_ENV, "EGPU_CDI_CARD_1": U1, ENV_MEMORY_LIMIT_MIB: "4096", "EGPU_CORES": "30"}
    plan = decide(Inputs("ctr2", env, {}))
    assert isinstance(plan, Apply), plan
    assert [uuid for uuid, _ in card_shares(plan)] == [U0, U1]
    agreeing = decide(Inputs("ctr2", {**env, "NVIDIA_VISIBLE_DEVICES": f"{U1},{U0}"}, {}))
    assert agreeing == plan
    for visible in (U0, f"{U0},GPU-cccc", "all"):
        other = decide(Inputs("ctr2", {**env, "NVIDIA_VISIBLE_DEVICES": visible}, {}))
        assert isinstance(other, Refuse), (visible, other)


def test_a_raw_containers_interposer_uses_the_folder_the_hook_mounts() -> None:
    """Bug: the hook mounted containers/<id>_raw but the interposer opened
    containers/local-uid<uid>/region (not there: a non-root container could not create it, a
    root one wrote it in its own filesystem)."""
    env = {**CDI_ENV, ENV_MEMORY_LIMIT_MIB: "4096"}
    plan = decide(Inputs("ctr3", env, {}))
    assert isinstance(plan, Apply) and plan.config is not None
    assert plan.config.container_region == (
        f"/var/run/egpu/containers/{plan.region_name}/region")


def test_two_raw_containers_of_one_uid_on_one_card_are_two_shares(tmp_path) -> None:
    """Bug: both mapped to one roster owner (local-uid<uid>): the second hook run overwrote
    the first's terms and one share file served both."""
    card = tmp_path / U0
    card.mkdir()
    env = {**CDI_ENV, ENV_MEMORY_LIMIT_MIB: "4096"}
    a = decide(Inputs("ctrA", {**env, "EGPU_CORES": "30"}, {}))
    b = decide(Inputs("ctrB", {**env, "EGPU_CORES": "50"}, {}))
    assert isinstance(a, Apply) and isinstance(b, Apply)
    ((_, ea),), ((_, eb),) = card_shares(a), card_shares(b)
    assert ea.owner != eb.owner
    card_roster.register(str(card), U0, ea)
    card_roster.register(str(card), U0, eb)
    roster = card_roster.read_roster(str(card))
    assert sorted((e.cores, e.name) for e in roster.shares().values()) == [
        (30, "ctrA_raw"), (50, "ctrB_raw")]


def test_a_named_container_with_cdi_cards_beyond_its_share_is_refused() -> None:
    """egpu's card device comes only with a share: a pod's own CDI annotation for another
    card, or for a card without an allocation, is refused."""
    env = {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x", "EGPU_CDI_CARD_0": U0}
    assert isinstance(decide(Inputs("c1", env, ANN, shares(U0))), Apply)
    extra = decide(Inputs("c1", {**env, "EGPU_CDI_CARD_1": U1}, ANN, shares(U0)))
    assert isinstance(extra, Refuse) and U1 in extra.message
    alone = decide(Inputs("c1", {"EGPU_CDI_CARD_1": U1}, ANN, None))
    assert isinstance(alone, Refuse) and "no share" in alone.message


# --- issue 24: a pod that joins a claim prepared for another pod --------------------------------
CLAIM = "c1a1c1a1-0000-4000-8000-000000000024"


def claim_file(*sets: str, namespace: str = "ns") -> PodShares:
    """A claim's shares file (egpu.dra.allocation.claim_shares) offering ``sets``."""
    entries = tuple(ContainerAllocation(s, False, (CardShare(U0, 0, 3000, 25),),
                                        share=f"claim-{CLAIM}_{s}") for s in sets)
    return PodShares(namespace, "shared", CLAIM, "low", "elastic", False, Allocation(entries), 5)


def claim_env(*requests: str, claim: str = CLAIM) -> dict[str, str]:
    env = {"NVIDIA_VISIBLE_DEVICES": U0, ENV_DEVICES: "x"}
    env.update({f"EGPU_CLAIM_SHARE_{claim}_{r}": f"{claim}/{r}" for r in requests})
    return env


def marks(*requests: str, claim: str = CLAIM) -> frozenset[str]:
    """The device nodes the claim's CDI devices of ``requests`` give a container."""
    return frozenset(claim_mark_path(claim, r) for r in requests)


def test_a_joining_pod_gets_the_claims_share_and_folder_of_its_requests() -> None:
    result = decide(Inputs("c1", claim_env("gpu"), ANN, None, None, claim_file("gpu"),
                           devices=marks("gpu")))
    assert isinstance(result, Apply) and result.config is not None
    assert (result.dir_name, result.region_name) == ("uid-a_main", f"claim-{CLAIM}_gpu")
    assert result.config.container_region == (
        f"/var/run/egpu/containers/claim-{CLAIM}_gpu/region")
    assert (result.config.pod, result.config.pod_uid, result.config.container) == (
        "pa", "uid-a", "main")
    assert (result.config.priority, result.config.compute_policy,
            result.config.low_priority_floor) == ("low", "elastic", 5)
    ((uuid, entry),) = card_shares(result)
    assert (uuid, entry.owner, entry.cores) == (U0, share_owner(f"claim-{CLAIM}_gpu"), 25)


@pytest.mark.parametrize(("env", "claim", "message"), [
    (claim_env("gpu"), None, "is not prepared on this node"),
    (claim_env("gpu"), claim_file("gpu", namespace="other"),
     "is not of the pod's namespace (ns)"),
    (claim_env("gpu", "extra"), claim_file("gpu", "extra"),
     "is shared as requests gpu | extra; a pod that joins it names one of these exactly, "
     "not extra, gpu"),
    ({**claim_env("gpu"), **claim_env("gpu", claim="c2")}, claim_file("gpu"),
     "devices of 2 egpu ResourceClaims"),
])
def test_a_joining_pod_is_refused_what_the_claim_does_not_offer_it(
        env: dict[str, str], claim: PodShares | None, message: str) -> None:
    """Each refusal keeps a budget whole: no claim of this node, another namespace's, a
    request set overlapping the shared ones (two budgets over one booking), two claims."""
    result = decide(Inputs("c1", env, ANN, None, None, claim,
                           devices=marks("gpu", "extra") | marks("gpu", claim="c2")))
    assert isinstance(result, Refuse) and message in result.message, result


@pytest.mark.parametrize("devices", [frozenset(), marks("other"), marks("gpu", claim="c2"),
                                     frozenset({"/dev/null", f"/dev/egpu-claim-{CLAIM}"})])
def test_a_pod_that_only_sets_a_claims_variables_cannot_join_it(devices: frozenset[str]
                                                                 ) -> None:
    """A pod of the claim's namespace that does not reference the claim gets none of its CDI
    devices, but it can write their variables into its own env. Bug caught: the hook believed
    the variables, so such a pod drew on the claim's budget and took a roster entry on its
    card each container, past the shares the scheduler booked (32 fill a card's roster)."""
    result = decide(Inputs("c1", claim_env("gpu"), ANN, None, None, claim_file("gpu"),
                           devices=devices))
    assert isinstance(result, Refuse), result
    assert result.message == (
        f"egpu: pod uid-a container 'main' names requests gpu of ResourceClaim {CLAIM} in its "
        "environment (EGPU_CLAIM_SHARE_*) but was not given their CDI devices (no device node "
        f"/dev/egpu-claim-{CLAIM}-gpu); the kubelet gives them only to the containers of pods "
        "that reference the claim: refusing to join another pod's share")


def test_a_forged_claim_variable_names_no_claim() -> None:
    env = {"EGPU_CLAIM_SHARE_x_gpu": f"{CLAIM}/gpu", "EGPU_CLAIM_SHARE_y_a/b": "y/a/b"}
    assert claim_requests(env) == {}


def test_the_spec_names_the_device_nodes_the_runtime_creates() -> None:
    """``linux.devices`` paths are what rule 4b's claim check reads; anything malformed there
    names no device (a refusal, never a join)."""
    spec = {"root": {"path": "/r"}, "linux": {"devices": [
        {"path": claim_mark_path(CLAIM, "gpu"), "type": "c", "major": 1, "minor": 3},
        {"path": 7}, "junk", {"type": "c"}]}}
    assert parse_spec(json.dumps(spec), "/b").devices == {claim_mark_path(CLAIM, "gpu")}
    for linux in ({}, {"devices": "x"}, "x", None):
        assert parse_spec(json.dumps({"root": {"path": "/r"}, "linux": linux}),
                          "/b").devices == frozenset()
