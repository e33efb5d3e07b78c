"""kwok, the fake kubelet of the simulated nodes: which nodes it manages and how it runs.

kwok manages only the nodes annotated ``kwok.x-k8s.io/node=fake`` (devcluster.nodes puts the
annotation on each simulated node), with kwok's own "fast" stages (``kwok_stages.yaml``,
copied from kwok v0.8.0): nodes turn Ready, scheduled pods turn Running at once, deleted
pods go away. Simulated pods get addresses from ``POD_CIDR``.
"""

from __future__ import annotations

from pathlib import Path

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
# 198.18.0.0/15 (RFC 2544, reserved for benchmark networks), never the private ranges.
POD_CIDR = "198.18.128.1/17"
STAGES = Path(__file__).with_name("kwok_stages.yaml")
# kwok's workers that play the stages (its default: 4 each). A real kubelet admits its own
# pods, thousands of nodes in parallel; 4 workers for a fleet of 1000 simulated nodes made pods
# wait seconds to turn Running under a burst, and egpu-kube-scheduler's bind gate waits for that.
PARALLELISM = 16
OPTIONS = f"""\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: {PARALLELISM}
  nodePlayStageParallelism: {PARALLELISM}
  nodeLeaseParallelism: {PARALLELISM}
"""


def config_text() -> str:
    """kwok's --config file: its options and the stages."""
    return OPTIONS + "---\n" + STAGES.read_text()
NODE_LEASE_S = 40


def kwok_argv(binary: Path | str, kubeconfig: Path | str, config: Path | str, host: str,
              port: int) -> list[str]:
    """kwok's command line: the annotated nodes only, serving /healthz on ``host:port``."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector="
        f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
        f"--cidr={POD_CIDR}",
        f"--node-ip={host}",
        f"--server-address={host}:{port}",
        f"--node-lease-duration-seconds={NODE_LEASE_S}",
    ]
