"""How egpu reads a workload: the pure core of ``egpu explain``.

``explain_objects(objects, config)`` returns one ``dict`` per pod template, JSON-ready:
``{"object": "Kind ns/name", "egpu": bool, "valid": bool, "priority": ..., "containers": [...],
"errors": [...]}``. ``format_text(reports)`` renders them for people.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from egpu.config import Config
from egpu.requests import read_pod
from egpu.workloads import pod_templates


def explain_objects(objects: Iterable[Any], config: Config) -> list[dict[str, Any]]:
    """One report per pod template found in ``objects`` (parsed YAML documents)."""
    reports: list[dict[str, Any]] = []
    for obj in objects:
        for template in pod_templates(obj):
            reading = read_pod(template.pod, config)
            report: dict[str, Any] = {"object": template.label, "egpu": reading.is_egpu_pod,
                                      "valid": not reading.errors}
            if reading.request is not None:
                request = reading.request
                report.update(
                    scheduler=config.scheduler_name,
                    priority=request.priority,
                    compute_policy=request.compute_policy,
                    memory_oversubscription=request.memory_oversubscription,
                    gpu_policy=request.gpu_policy,
                    node_policy=request.node_policy,
                    filters={k: list(v) for k, v in {
                        "use_gpu_types": request.use_gpu_types,
                        "nouse_gpu_types": request.nouse_gpu_types,
                        "use_gpu_uuids": request.use_gpu_uuids,
                        "nouse_gpu_uuids": request.nouse_gpu_uuids}.items() if v},
                    containers=[{
                        "name": c.name, "kind": c.kind.value, "gpus": c.share.gpus,
                        "memory_mib": c.share.memory_mib,
                        "memory_percentage": c.share.memory_percentage,
                        "cores": c.share.cores, "share": c.share.describe(),
                    } for c in request.containers],
                )
            report["errors"] = [e.message for e in reading.errors]
            reports.append(report)
    return reports


def format_text(reports: list[dict[str, Any]]) -> str:
    """Render reports as indented text, one block per pod template."""
    lines: list[str] = []
    for report in reports:
        if not report["egpu"]:
            lines.append(f"{report['object']}: not an egpu pod (left alone)")
            continue
        if not report["valid"]:
            lines.append(f"{report['object']}: DENIED")
            lines.extend(f"  - {message}" for message in report["errors"])
            continue
        oversub = ", memory oversubscription" if report["memory_oversubscription"] else ""
        lines.append(
            f"{report['object']}: scheduler {report['scheduler']}, priority {report['priority']}, "
            f"{report['compute_policy']} compute{oversub}, cards {report['gpu_policy']}, "
            f"nodes {report['node_policy']}")
        for key, values in report["filters"].items():
            lines.append(f"  {key.replace('_', '-')}: {', '.join(values)}")
        for c in report["containers"]:
            lines.append(f"  {c['kind']} {c['name']}: {c['share']}")
    return "\n".join(lines)
