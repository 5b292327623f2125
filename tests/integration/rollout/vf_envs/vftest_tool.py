"""A tool-using verifiers environment: each task's tools are an MCP toolset (``vftest_calc``)."""

import verifiers.v1 as vf
from vftest_calc import Calc, CalcConfig

ROWS = [(17, 25), (6, 7), (40, 2), (11, 31)]


class SumData(vf.TaskData):
    answer: str


class SumTaskConfig(vf.TaskConfig):
    calc: CalcConfig = CalcConfig()


class SumTask(vf.Task[SumData, vf.State, SumTaskConfig]):
    @classmethod
    def toolsets(cls, config: SumTaskConfig) -> list[vf.Toolset]:
        return [Calc(config.calc)]

    @vf.reward(weight=0.8)
    async def correct(self, task, trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.reward(weight=0.2)
    async def used_tool(self, trace) -> float:
        return float(len(trace.tool_messages) > 0)


class SumTasksetConfig(vf.TasksetConfig):
    task: SumTaskConfig = SumTaskConfig()


class SumTaskset(vf.Taskset[SumTask, SumTasksetConfig]):
    def load(self):
        for index, (a, b) in enumerate(ROWS):
            yield SumTask(SumData(id=f"sum-{index}", prompt=f"Use the calculator to add {a} and {b}.",
                                  answer=str(a + b)), self.config.task)


__all__ = ["SumTaskset"]
