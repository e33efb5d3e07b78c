"""The benchmarks' figures: the percentile is the product's (egpu.stats), one function for every
figure; a process's CPU time from Linux /proc."""

import os
from pathlib import Path

from egpu.stats import percentile

__all__ = ["cpu_seconds", "percentile"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (Linux /proc/<pid>/stat). Raises
    OSError when the process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
