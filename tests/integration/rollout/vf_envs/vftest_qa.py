"""A single-turn verifiers environment over local data: a question, a two-function weighted rubric."""

import verifiers.v1 as vf

ROWS = [("What is 2 + 2?", "4"), ("What is the capital of France?", "Paris"), ("How many legs has a spider?", "8"),
        ("What colour is the sky?", "blue"), ("What is 3 * 3?", "9"), ("Name a primary colour.", "red")]


class QAData(vf.TaskData):
    answer: str
    explode: bool = False           # its rubric raises (a broken reward function fails that session only)


class QATask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, task, trace) -> float:
        if task.explode:
            raise ZeroDivisionError("the rubric broke on purpose")
        return float(trace.last_reply.strip().lower() == task.answer.lower())

    @vf.reward(weight=0.5)
    async def short(self, trace) -> float:
        return float(len(trace.last_reply) < 40)

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class QATasksetConfig(vf.TasksetConfig):
    num_examples: int = len(ROWS)
    instruction: str = "Answer with the answer alone."
    explode_first: bool = False


class QATaskset(vf.Taskset[QATask, QATasksetConfig]):
    def load(self):
        for index, (question, answer) in enumerate(ROWS[:self.config.num_examples]):
            yield QATask(QAData(id=f"qa-{index}", prompt=question, answer=answer, system_prompt=self.config.instruction,
                                explode=self.config.explode_first and index == 0), self.config.task)


__all__ = ["QATaskset"]
