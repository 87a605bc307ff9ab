"""The resource limits a container asks for: no more than its host allows (issue 65,
item 11), and the reason the engine gives when it refuses one anyway."""

from __future__ import annotations

import resource

from shipyard.backends.containers import _engine_refusal, host_ulimits, ulimits_within

INFINITY = resource.RLIM_INFINITY


def test_each_limit_is_the_hard_limit_at_most_the_kernels_ceiling() -> None:
    # This machine: nofile 20000 under nr_open's million; nproc 96365 over pid_max 32768
    # (Podman runs with the latter and refused a container asking for more).
    chosen = ulimits_within({"nofile": 20000, "nproc": 96365}, {"nofile": 1048576, "nproc": 32768})
    assert chosen == {"nofile": 20000, "nproc": 32768}


def test_an_unlimited_hard_limit_takes_the_ceiling_or_is_left_to_the_engine() -> None:
    chosen = ulimits_within({"nofile": INFINITY, "nproc": INFINITY}, {"nofile": 1048576})
    assert chosen == {"nofile": 1048576}


def test_this_hosts_limits_are_within_its_hard_limits() -> None:
    chosen = host_ulimits()
    assert 0 < chosen["nofile"] <= resource.getrlimit(resource.RLIMIT_NOFILE)[1] or (
        resource.getrlimit(resource.RLIMIT_NOFILE)[1] == INFINITY
    )
    hard_nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    assert hard_nproc == INFINITY or chosen["nproc"] <= hard_nproc


def test_a_refused_limit_is_named_with_what_to_change() -> None:
    engine_said = Exception(
        "500 Server Error: runc create failed: unable to start container process: error "
        "during container init: error setting rlimits for ready process: error setting "
        "rlimit type 6: operation not permitted: OCI permission denied"
    )
    why = _engine_refusal(engine_said)
    assert "error setting rlimit type 6" in why
    assert "nproc limit" in why and "LimitNPROC" in why and "ulimit -H" in why
    assert _engine_refusal(Exception("no such image")) == "no such image"
