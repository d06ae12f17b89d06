"""The pipeline schedules by name (`parallel.schedule`): torch's GPipe and 1F1B."""

from __future__ import annotations

from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from facetrain.registry import Registry

PIPELINE_SCHEDULES: Registry[PipelineScheduleSingle] = Registry("pipeline schedule")
PIPELINE_SCHEDULES.register("gpipe")(ScheduleGPipe)
PIPELINE_SCHEDULES.register("1f1b")(Schedule1F1B)
