"""Alarms: evaluated every period, their state changed as CloudWatch changes it, their
actions run.

An alarm looks at its last ``EvaluationPeriods`` complete periods (a period is complete
once the recorder has written it: ``lag_s`` after its end). Each period's value breaches
or not by ``ComparisonOperator`` against ``Threshold``; a period with no datapoint is
treated by ``TreatMissingData``: ``breaching`` or ``notBreaching`` count it as such;
with ``missing`` (the default) and ``ignore`` only the periods with data count, and an
alarm whose periods all lack data goes to ``INSUFFICIENT_DATA`` (``missing``) or stays
as it is (``ignore``). ``DatapointsToAlarm`` (M) of the N periods breaching is ALARM;
fewer is OK. With fewer than M datapoints present, ``missing`` needs all of them to
breach for ALARM and ``ignore`` keeps the state.

A change of state is written with its history item and, when the new state's actions
name topics, its event (one transaction: the notification is sent exactly once). Scaling
policy actions run on the change and again each period the alarm stays in that state,
as CloudWatch repeats Auto Scaling actions; the policy's cooldown paces them.

One gateway evaluates: the holder of the ``alarms`` lease, so gateways sharing the store
never change an alarm twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shipyard.cloudwatch.service import (
    OPERATORS,
    CloudWatchService,
    alarm_period,
    queries_of,
)
from shipyard.errors import ShipyardError
from shipyard.leases import Leases
from shipyard.records import Event, ScalingPolicy
from shipyard.storage.metrics import Alarm, HistoryItem, MetricStore

log = logging.getLogger(__name__)

ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"
_POLICY_ARN = "arn:aws:autoscaling:"
_SNS_ARN = "arn:aws:sns:"

PolicyRunner = Callable[[str, str, str, float | None, float], str]
"""(policy ARN, alarm name, its state, the value that breached or None, threshold) -> what
it did."""


ACTION_KEYS = ("AlarmActions", "OKActions", "InsufficientDataActions")
"""An alarm's lists of actions, one per state it enters."""


def action_check(
    *,
    policy_by_arn: Callable[[str], ScalingPolicy | None],
    unknown_topics: Callable[[Sequence[str]], list[str]],
) -> Callable[[str], str | None]:
    """What PutMetricAlarm holds each action ARN to: an SNS topic this gateway knows, or
    an Application Auto Scaling step policy. The check returns None when the action can
    run, else why not (the caller's ``InvalidParameterValue`` says it)."""

    def check(arn: str) -> str | None:
        if arn.startswith(_POLICY_ARN):
            policy = policy_by_arn(arn)
            if policy is None:
                return "no scaling policy has this ARN."
            if policy.policy_type != "StepScaling":
                return f"policy {policy.name} is a {policy.policy_type} policy, not StepScaling."
            return None
        if arn.startswith(_SNS_ARN):
            if unknown_topics([arn]):
                return "no such topic: declare it under topics: in the stack file."
            return None
        return "shipyard runs SNS topic and Application Auto Scaling policy actions only."

    return check


def alarms_naming(store: MetricStore, arn: str) -> list[tuple[str, str]]:
    """(name, ARN) of the alarms any of whose actions name ``arn``: what
    DescribeScalingPolicies lists under a policy."""
    return [
        (a.name, a.arn)
        for a in store.list_alarms()
        if any(arn in (a.config.get(k) or ()) for k in ACTION_KEYS)
    ]


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str
    reason: str
    data: dict[str, Any]
    value: float | None
    """The newest value compared (what a step policy's bounds are measured from)."""


def judge(config: dict[str, Any], values: list[float | None], state: str) -> Verdict | None:
    """The state ``values`` (oldest first, one per period, None where missing) put an
    alarm in; None to keep ``state`` (missing data with ``ignore``)."""
    threshold = float(config["Threshold"])
    compare = OPERATORS[config["ComparisonOperator"]]
    n = int(config["EvaluationPeriods"])
    m = int(config.get("DatapointsToAlarm") or n)
    treat = config.get("TreatMissingData", "missing")
    present = [v for v in values if v is not None]
    newest = next((v for v in reversed(values) if v is not None), None)
    data = {"threshold": threshold, "recentDatapoints": [round(v, 6) for v in present]}
    if treat in ("breaching", "notBreaching"):
        breaches = sum(
            1
            for v in values
            if (v is None and treat == "breaching") or (v is not None and compare(v, threshold))
        )
    elif not present:
        if treat == "ignore":
            return None
        return Verdict(
            "INSUFFICIENT_DATA",
            f"Insufficient Data: {n} datapoint{'s were' if n > 1 else ' was'} unknown.",
            data,
            None,
        )
    else:
        breaches = sum(1 for v in present if compare(v, threshold))
        if len(present) < m:
            # Fewer datapoints than DatapointsToAlarm: with "missing", as many as there
            # are must breach for ALARM; "ignore" keeps the state (CloudWatch's table).
            if treat == "ignore":
                return None
            m = len(present)
    word = _WORDS[config["ComparisonOperator"]]
    shown = ", ".join(f"{v:g}" for v in reversed(present[-5:])) or (f"no data, treated as {treat}")
    if breaches >= m:
        return Verdict(
            "ALARM",
            f"Threshold Crossed: {breaches} out of the last {n} datapoints [{shown}] {word} the "
            f"threshold ({threshold:g}) (minimum {m} datapoint{'s' if m > 1 else ''} for OK -> "
            "ALARM transition).",
            data,
            newest,
        )
    good = n - breaches
    relation = word.removeprefix("were ")
    needed = n - m + 1
    return Verdict(
        "OK",
        f"Threshold Crossed: {good} out of the last {n} datapoints [{shown}] "
        f"{'were' if good > 1 else 'was'} not {relation} the threshold ({threshold:g}) "
        f"(minimum {needed} datapoint{'s' if needed > 1 else ''} for ALARM -> OK transition).",
        data,
        newest,
    )


_WORDS = {
    "GreaterThanOrEqualToThreshold": "were greater than or equal to",
    "GreaterThanThreshold": "were greater than",
    "LessThanThreshold": "were less than",
    "LessThanOrEqualToThreshold": "were less than or equal to",
}

_ACTION_KEYS = {
    "ALARM": "AlarmActions",
    "OK": "OKActions",
    "INSUFFICIENT_DATA": "InsufficientDataActions",
}


class AlarmActions:
    """Changes an alarm's state and runs the new state's actions: the one path for the
    evaluator and for SetAlarmState."""

    def __init__(
        self,
        *,
        store: MetricStore,
        region: str,
        account_id: str,
        run_policy: PolicyRunner,
        on_event: Callable[[], None],
    ) -> None:
        self.store = store
        self.region = region
        self.account_id = account_id
        self.run_policy = run_policy
        self.on_event = on_event

    def __repr__(self) -> str:
        return f"AlarmActions({self.store!r})"

    def transition(
        self,
        alarm: Alarm,
        state: str,
        reason: str,
        data: dict[str, Any] | str | None,
        *,
        value: float | None = None,
        when: datetime | None = None,
    ) -> bool:
        """Move ``alarm`` to ``state`` and run that state's actions; False when another
        change got there first."""
        when = when or datetime.now(UTC)
        reason_data = data if isinstance(data, str) or data is None else json.dumps(data)
        summary = f"Alarm updated from {alarm.state} to {state}"
        history = HistoryItem(
            alarm.name,
            when,
            "StateUpdate",
            summary,
            json.dumps(
                {
                    "version": "1.0",
                    "oldState": {"stateValue": alarm.state, "stateReason": alarm.reason},
                    "newState": {"stateValue": state, "stateReason": reason},
                }
            ),
        )
        actions = self._actions(alarm, state)
        topics = tuple(a for a in actions if not a.startswith(_POLICY_ARN))
        event = self._event(alarm, state, reason, when, topics) if topics else None
        changed = self.store.change_state(
            alarm.name,
            state=state,
            reason=reason,
            reason_data=reason_data,
            when=when,
            history=history,
            event=event,
            expected=alarm.state,
            configured=alarm.config_updated,
        )
        if not changed:
            return False
        if event is not None:
            self.on_event()
        self.run_policies(alarm, state, value)
        return True

    def run_policies(self, alarm: Alarm, state: str, value: float | None) -> None:
        """Run the scaling policy actions of ``state``, each noted in the alarm's history."""
        threshold = float(alarm.config.get("Threshold", 0.0))
        for arn in self._actions(alarm, state):
            if not arn.startswith(_POLICY_ARN):
                continue
            try:
                outcome = self.run_policy(arn, alarm.name, state, value, threshold)
                summary = f"Successfully executed action {arn}"
            except ShipyardError as exc:
                outcome = exc.message
                summary = f"Failed to execute action {arn}"
            self.store.add_history(
                HistoryItem(
                    alarm.name,
                    datetime.now(UTC),
                    "Action",
                    summary,
                    json.dumps(
                        {
                            "actionState": "Succeeded",
                            "stateUpdateTimestamp": 0,
                            "notificationResource": arn,
                            "message": outcome,
                        }
                    ),
                )
            )

    def _actions(self, alarm: Alarm, state: str) -> list[str]:
        if not alarm.config.get("ActionsEnabled", True):
            return []
        return list(alarm.config.get(_ACTION_KEYS[state]) or ())

    def _event(
        self, alarm: Alarm, state: str, reason: str, when: datetime, topics: tuple[str, ...]
    ) -> Event:
        stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        config = alarm.config
        trigger = {
            "MetricName": config.get("MetricName"),
            "Namespace": config.get("Namespace"),
            "Statistic": config.get("Statistic"),
            "ExtendedStatistic": config.get("ExtendedStatistic"),
            "Dimensions": [
                {"name": d["Name"], "value": d["Value"]} for d in config.get("Dimensions") or ()
            ],
            "Period": config.get("Period"),
            "EvaluationPeriods": config.get("EvaluationPeriods"),
            "DatapointsToAlarm": config.get("DatapointsToAlarm"),
            "ComparisonOperator": config.get("ComparisonOperator"),
            "Threshold": config.get("Threshold"),
            "TreatMissingData": config.get("TreatMissingData", "missing"),
        }
        message = {
            "AlarmName": alarm.name,
            "AlarmDescription": config.get("AlarmDescription"),
            "AWSAccountId": self.account_id,
            "AlarmConfigurationUpdatedTimestamp": alarm.config_updated.isoformat(),
            "NewStateValue": state,
            "NewStateReason": reason,
            "StateChangeTime": stamp,
            "Region": self.region,
            "AlarmArn": alarm.arn,
            "OldStateValue": alarm.state,
            "Trigger": trigger,
        }
        return Event(
            key=f"alarm:{alarm.name}:{stamp}:{state}",
            detail_type=ALARM_STATE_CHANGE,
            source="aws.cloudwatch",
            resource=alarm.arn,
            detail={
                "alarmName": alarm.name,
                "state": {"value": state, "reason": reason, "timestamp": stamp},
                "previousState": {"value": alarm.state, "reason": alarm.reason},
                "configuration": {k: v for k, v in trigger.items() if v is not None},
            },
            topics=topics,
            subject=f'{state}: "{alarm.name}" in {self.region}'[:100],
            message=json.dumps(message),
            time=when,
        )


class AlarmEvaluator:
    """Evaluates every alarm once per period (see the module)."""

    def __init__(
        self,
        *,
        service: CloudWatchService,
        actions: AlarmActions,
        leases: Leases | None,
        tick_s: float,
        lag_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self.actions = actions
        self.leases = leases
        self.tick_s = tick_s
        self.lag_s = lag_s
        self._clock = clock
        self._done: dict[str, tuple[float, int]] = {}
        """Per alarm: (config stamp, end of the newest period evaluated)."""

    def __repr__(self) -> str:
        return f"AlarmEvaluator(tick_s={self.tick_s:g}, alarms={len(self._done)})"

    async def run(self) -> None:
        """Evaluate each tick while this gateway holds the ``alarms`` lease, renewed as
        often as the lease needs."""
        next_at = 0.0
        renew_s = self.leases.renew_s if self.leases is not None else self.tick_s
        while True:
            held = True
            if self.leases is not None:
                held = "evaluator" in await self.leases.claim({"evaluator"})
            now = self._clock()
            if not held:
                self._done.clear()
                next_at = now + renew_s  # not ours: ask again when a holder would renew
            elif now >= next_at:
                next_at = (now // self.tick_s + 1) * self.tick_s + self.lag_s % self.tick_s
                try:
                    await asyncio.to_thread(self.evaluate, now)
                except Exception:  # one bad pass must not stop the alarms
                    log.exception("evaluating alarms failed")
            await asyncio.sleep(min(renew_s, max(next_at - self._clock(), 0.05)))

    def evaluate(self, now: float) -> None:
        """One pass: each alarm whose newest complete period is new since its last pass."""
        alarms = self.service.store.list_alarms()
        names = {a.name for a in alarms}
        for name in [n for n in self._done if n not in names]:
            del self._done[name]
        for alarm in alarms:
            try:
                self._evaluate(alarm, now)
            except ShipyardError as exc:
                log.warning("alarm %s cannot be evaluated: %s", alarm.name, exc.message)
            except Exception:  # one alarm's bug must not stop the others
                log.exception("alarm %s cannot be evaluated", alarm.name)

    def _evaluate(self, alarm: Alarm, now: float) -> None:
        config = alarm.config
        period = alarm_period(config)
        newest_end = int((now - self.lag_s) // period * period)
        stamp = alarm.config_updated.timestamp()
        if self._done.get(alarm.name) == (stamp, newest_end):
            return
        self._done[alarm.name] = (stamp, newest_end)
        n = int(config["EvaluationPeriods"])
        start = newest_end - n * period
        queries, returned = queries_of(config)
        results = {r.id: r for r in self.service.metric_data(queries, start, newest_end)}
        points = results[returned].points
        values = [points.get(start + k * period) for k in range(n)]
        verdict = judge(config, values, alarm.state)
        if verdict is None:
            return
        when = datetime.fromtimestamp(now, UTC)
        verdict.data.update(
            {
                "version": "1.0",
                "queryDate": when.isoformat(timespec="milliseconds"),
                "startDate": datetime.fromtimestamp(start, UTC).isoformat(timespec="milliseconds"),
                "period": period,
            }
        )
        if verdict.state != alarm.state:
            log.info(
                "alarm %s: %s -> %s (%s)", alarm.name, alarm.state, verdict.state, verdict.reason
            )
            self.actions.transition(
                alarm, verdict.state, verdict.reason, verdict.data, value=verdict.value, when=when
            )
        else:
            self.actions.run_policies(alarm, alarm.state, verdict.value)
