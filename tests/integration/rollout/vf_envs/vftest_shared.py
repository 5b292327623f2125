"""A tool-using verifiers environment whose toolset belongs to the taskset: one server shared by every episode."""

import verifiers.v1 as vf
from vftest_calc import Calc, CalcConfig
from vftest_tool import SumData, SumTask, SumTaskConfig

ROWS = [(3, 4), (12, 30), (25, 25), (8, 9)]


class SharedSumConfig(vf.TasksetConfig):
    task: SumTaskConfig = SumTaskConfig()
    calc: CalcConfig = CalcConfig()


class SharedSumTask(SumTask):
    @classmethod
    def toolsets(cls, config: SumTaskConfig) -> list[vf.Toolset]:
        return []                       # the taskset's shared calculator serves every episode


class SharedSumTaskset(vf.Taskset[SharedSumTask, SharedSumConfig]):
    @classmethod
    def toolsets(cls, config: SharedSumConfig) -> list[vf.Toolset]:
        return [Calc(config.calc)]

    def load(self):
        for index, (a, b) in enumerate(ROWS):
            yield SharedSumTask(SumData(id=f"shared-{index}", prompt=f"Use the calculator to add {a} and {b}.",
                                        answer=str(a + b)), self.config.task)


__all__ = ["SharedSumTaskset"]
