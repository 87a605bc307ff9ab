"""Model Monitor's actions: data quality job definitions, monitoring schedules and
their executions (MonitoringService)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.gateway.api.actions.listing import page
from shipyard.monitoring.service import DATA_QUALITY, MonitoringService
from shipyard.storage.monitoring import Definition, Execution, Schedule

_DEFINITION_FIELDS = (
    "DataQualityBaselineConfig",
    "DataQualityAppSpecification",
    "DataQualityJobInput",
    "DataQualityJobOutputConfig",
    "JobResources",
    "NetworkConfig",
    "RoleArn",
    "StoppingCondition",
)


def create_data_quality_job_definition(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    return {"JobDefinitionArn": svc.create_definition(p).arn}


def describe_data_quality_job_definition(
    svc: MonitoringService, p: dict[str, Any]
) -> dict[str, Any]:
    found = svc.describe_definition(p["JobDefinitionName"])
    out: dict[str, Any] = {
        "JobDefinitionArn": found.arn,
        "JobDefinitionName": found.name,
        "CreationTime": found.created,
    }
    out.update({k: found.request[k] for k in _DEFINITION_FIELDS if k in found.request})
    return out


def list_data_quality_job_definitions(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    definitions = svc.list_definitions()
    if endpoint := p.get("EndpointName"):
        definitions = [d for d in definitions if _definition_endpoint(d) == endpoint]
    chosen, token = page(
        definitions,
        p,
        kind="JobDefinitionSummaries",
        name=lambda d: d.name,
        created=lambda d: d.created,
        sort_keys={"Name": lambda d: d.name, "CreationTime": lambda d: d.created},
    )
    out: dict[str, Any] = {
        "JobDefinitionSummaries": [
            {
                "MonitoringJobDefinitionName": d.name,
                "MonitoringJobDefinitionArn": d.arn,
                "CreationTime": d.created,
                "EndpointName": _definition_endpoint(d),
            }
            for d in chosen
        ]
    }
    if token:
        out["NextToken"] = token
    return out


def delete_data_quality_job_definition(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete_definition(p["JobDefinitionName"])
    return {}


def create_monitoring_schedule(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    return {"MonitoringScheduleArn": svc.create_schedule(p).arn}


def update_monitoring_schedule(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    return {"MonitoringScheduleArn": svc.update_schedule(p).arn}


def describe_monitoring_schedule(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    schedule = svc.describe_schedule(p["MonitoringScheduleName"])
    out: dict[str, Any] = {
        "MonitoringScheduleArn": schedule.arn,
        "MonitoringScheduleName": schedule.name,
        "MonitoringScheduleStatus": schedule.status,
        "MonitoringType": _type(schedule),
        "CreationTime": schedule.created,
        "LastModifiedTime": schedule.modified,
        "MonitoringScheduleConfig": schedule.request["MonitoringScheduleConfig"],
        "EndpointName": _endpoint(svc, schedule),
    }
    if schedule.failure_reason:
        out["FailureReason"] = schedule.failure_reason
    last = svc.last_execution(schedule.name)
    if last is not None:
        out["LastMonitoringExecutionSummary"] = _execution(last)
    return out


def list_monitoring_schedules(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    schedules = svc.list_schedules()
    if endpoint := p.get("EndpointName"):
        schedules = [s for s in schedules if _endpoint(svc, s) == endpoint]
    if definition := p.get("MonitoringJobDefinitionName"):
        schedules = [s for s in schedules if _definition(s) == definition]
    if kind := p.get("MonitoringTypeEquals"):
        schedules = [s for s in schedules if _type(s) == kind]
    chosen, token = page(
        schedules,
        p,
        kind="MonitoringScheduleSummaries",
        name=lambda s: s.name,
        created=lambda s: s.created,
        modified=lambda s: s.modified,
        status=lambda s: s.status,
        sort_keys={
            "Name": lambda s: s.name,
            "CreationTime": lambda s: s.created,
            "Status": lambda s: s.status,
        },
    )
    summaries = []
    for s in chosen:
        summary: dict[str, Any] = {
            "MonitoringScheduleName": s.name,
            "MonitoringScheduleArn": s.arn,
            "CreationTime": s.created,
            "LastModifiedTime": s.modified,
            "MonitoringScheduleStatus": s.status,
            "EndpointName": _endpoint(svc, s),
            "MonitoringType": _type(s),
        }
        if (name := _definition(s)) is not None:
            summary["MonitoringJobDefinitionName"] = name
        summaries.append(summary)
    out: dict[str, Any] = {"MonitoringScheduleSummaries": summaries}
    if token:
        out["NextToken"] = token
    return out


def delete_monitoring_schedule(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete_schedule(p["MonitoringScheduleName"])
    return {}


def start_monitoring_schedule(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    svc.start_schedule(p["MonitoringScheduleName"])
    return {}


def stop_monitoring_schedule(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    svc.stop_schedule(p["MonitoringScheduleName"])
    return {}


def list_monitoring_executions(svc: MonitoringService, p: dict[str, Any]) -> dict[str, Any]:
    runs = svc.executions()
    if schedule := p.get("MonitoringScheduleName"):
        runs = [e for e in runs if e.schedule == schedule]
    if endpoint := p.get("EndpointName"):
        runs = [e for e in runs if e.detail.get("endpoint") == endpoint]
    if definition := p.get("MonitoringJobDefinitionName"):
        runs = [e for e in runs if e.detail.get("definition") == definition]
    if (kind := p.get("MonitoringTypeEquals")) and kind != DATA_QUALITY:
        runs = []
    if (before := p.get("ScheduledTimeBefore")) is not None:
        runs = [e for e in runs if e.scheduled.timestamp() < float(before)]
    if (after := p.get("ScheduledTimeAfter")) is not None:
        runs = [e for e in runs if e.scheduled.timestamp() > float(after)]
    chosen, token = page(
        runs,
        p,
        kind="MonitoringExecutionSummaries",
        name=lambda e: e.job_name,
        created=lambda e: e.created,
        modified=lambda e: e.modified,
        status=lambda e: e.status,
        sort_keys={
            "CreationTime": lambda e: e.created,
            "ScheduledTime": lambda e: e.scheduled,
            "Status": lambda e: e.status,
        },
    )
    out: dict[str, Any] = {"MonitoringExecutionSummaries": [_execution(e) for e in chosen]}
    if token:
        out["NextToken"] = token
    return out


def _execution(e: Execution) -> dict[str, Any]:
    out: dict[str, Any] = {
        "MonitoringScheduleName": e.schedule,
        "ScheduledTime": e.scheduled,
        "CreationTime": e.created,
        "LastModifiedTime": e.modified,
        "MonitoringExecutionStatus": e.status,
        "EndpointName": e.detail.get("endpoint", ""),
        "MonitoringType": DATA_QUALITY,
    }
    if e.detail.get("request"):
        out["ProcessingJobArn"] = e.detail["job_arn"]
    if e.failure_reason:
        out["FailureReason"] = e.failure_reason
    if e.detail.get("definition"):
        out["MonitoringJobDefinitionName"] = e.detail["definition"]
    return out


def _definition_endpoint(d: Definition) -> str:
    endpoint_input = (d.request.get("DataQualityJobInput") or {}).get("EndpointInput") or {}
    return str(endpoint_input.get("EndpointName", ""))


def _config(s: Schedule) -> dict[str, Any]:
    return dict(s.request.get("MonitoringScheduleConfig") or {})


def _definition(s: Schedule) -> str | None:
    name = _config(s).get("MonitoringJobDefinitionName")
    return str(name) if name else None


def _type(s: Schedule) -> str:
    return str(_config(s).get("MonitoringType") or DATA_QUALITY)


def _endpoint(svc: MonitoringService, s: Schedule) -> str:
    config = _config(s)
    inline = config.get("MonitoringJobDefinition") or {}
    for item in inline.get("MonitoringInputs") or []:
        if name := (item.get("EndpointInput") or {}).get("EndpointName"):
            return str(name)
    definition = svc.store.definition(_definition(s) or "")
    return "" if definition is None else _definition_endpoint(definition)


ACTIONS: dict[str, Callable[[MonitoringService, dict[str, Any]], dict[str, Any]]] = {
    "CreateDataQualityJobDefinition": create_data_quality_job_definition,
    "DescribeDataQualityJobDefinition": describe_data_quality_job_definition,
    "ListDataQualityJobDefinitions": list_data_quality_job_definitions,
    "DeleteDataQualityJobDefinition": delete_data_quality_job_definition,
    "CreateMonitoringSchedule": create_monitoring_schedule,
    "DescribeMonitoringSchedule": describe_monitoring_schedule,
    "ListMonitoringSchedules": list_monitoring_schedules,
    "UpdateMonitoringSchedule": update_monitoring_schedule,
    "DeleteMonitoringSchedule": delete_monitoring_schedule,
    "StartMonitoringSchedule": start_monitoring_schedule,
    "StopMonitoringSchedule": stop_monitoring_schedule,
    "ListMonitoringExecutions": list_monitoring_executions,
}
