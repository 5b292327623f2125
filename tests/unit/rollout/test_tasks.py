"""The built-in tasks and the white-box agent loop: verifiers, the fixed held-out sets, teacher demonstrations, and
the agent's tool environment (parallel calls finish sooner, malformed calls and silent replies cost a process
reward, context management rewrites the history). The model is replaced by a scripted chat client: what is under
test is the task and agent code around it."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from forge.app.pretrain import demonstration
from forge.rollout import agent as rollout_agent
from forge.rollout.agent import run_episode
from forge.rollout.llm import Reply
from forge.rollout.tasks import (
    ALL_DOMAINS,
    DOMAINS,
    HELD_OUT,
    agent,
    eval_set,
    final_answer,
    long,
    make_task,
    prompt_key,
    qa,
    reasoning,
    task_stream,
)
from forge.rollout.tasks.agent import FORMAT_HINT, MALFORMED_PENALTY, ToolEnvironment
from forge.sampling.params import SamplingParams


def test_final_answer_reads_the_last_answer_line():
    assert final_answer("2 + 3 = 5. Answer: 5") == "5"
    assert final_answer("Answer: 4\nAnswer: red blue.") == "red blue"
    assert final_answer("no answer here") is None and final_answer("") is None


@pytest.mark.parametrize("domain", ALL_DOMAINS)
def test_verifiers_accept_the_answer_and_reject_others(domain):
    rng = random.Random(5)
    for index in range(50):
        task = make_task(domain, rng, f"t{index}")
        assert task.score(f"Answer: {task.answer}") == 1.0
        assert task.score(f"some work. Answer: {task.answer}x") == 0.0
        assert task.score("") == 0.0


def test_reasoning_answers_are_the_arithmetic():
    rng = random.Random(1)
    for index in range(100):
        task, numbers, operators = reasoning.make(rng, str(index))
        value = numbers[0]
        for operator, operand in zip(operators, numbers[1:], strict=True):
            value = value + operand if operator == "+" else value - operand
        assert task.answer == str(value) and value >= 0
        assert task.score(reasoning.solution(numbers, operators, rng, 0.0)) == 1.0
        assert task.score(reasoning.solution(numbers, operators, rng, 1.0)) == 0.0


def test_qa_asks_one_fact_of_a_table_whose_facts_have_different_kinds():
    rng = random.Random(3)
    for index in range(100):
        task, others = qa.make(rng, str(index))
        facts, question = task.messages[0]["content"], task.messages[1]["content"]
        kinds = [next(k for k, (relation, _, _) in enumerate(qa.RELATIONS) if f" {relation} " in f" {fact.strip()} ")
                 for fact in facts.removeprefix("Facts: ").split(".") if fact.strip()]
        assert len(kinds) == len(set(kinds)) in (2, 3)
        relation, _, values = next(r for r in qa.RELATIONS if r[1].split("{}")[0] in question and
                                     question.endswith(r[1].split("{}")[1]))
        assert f"{relation} {task.answer}." in facts and task.answer in values
        assert task.answer not in others and set(others) < set(values)
        assert task.score(qa.solution(task, others, rng, 1.0)) == 0.0


def test_qa_and_agent_teachers_are_right_without_noise():
    rng = random.Random(2)
    for index in range(50):
        task, others = qa.make(rng, str(index))
        assert task.score(qa.solution(task, others, rng, 0.0)) == 1.0
        task = agent.make(rng, str(index))
        conversation = agent.teacher_conversation(task, rng, 0.0)
        assert conversation[-1]["role"] == "assistant" and task.score(conversation[-1]["content"]) == 1.0


def test_held_out_sets_are_fixed_and_apart_from_the_training_stream():
    for domain in ALL_DOMAINS:
        first, second = eval_set(domain, 32), eval_set(domain, 32)
        assert [t.messages for t in first] == [t.messages for t in second]
        assert all(t.task_id.startswith(f"eval-{domain}") for t in first)
    stream = task_stream(DOMAINS, seed=0)
    domains = [next(stream).domain for _ in range(6)]
    assert domains == list(DOMAINS) * 2
    with pytest.raises(ValueError):
        make_task("poetry", random.Random(0), "x")
    with pytest.raises(ValueError):
        eval_set("qa", HELD_OUT + 1)


def test_no_held_out_prompt_is_trained_on():
    """The task spaces are small: without the exclusion most evaluation prompts recur within a few thousand training
    tasks, so this would fail (it did, before the stream skipped them)."""
    held_out = {d: {prompt_key(t) for t in eval_set(d, HELD_OUT)} for d in ALL_DOMAINS}
    unfiltered = random.Random(0)
    assert any(prompt_key(make_task("reasoning", unfiltered, "x")) in held_out["reasoning"] for _ in range(600))
    assert not held_out["long"] & held_out["agent"], "the tools tell long and agent prompts apart"
    stream = task_stream(ALL_DOMAINS, seed=0, page_lines=2)
    trained = [next(stream) for _ in range(4000)]
    assert not [t.task_id for t in trained if prompt_key(t) in held_out[t.domain]]
    rng = random.Random(0)
    demonstrations = [demonstration(DOMAINS[i % 3], rng, i)[0] for i in range(1500)]
    def opening(conversation: list[dict]) -> str:
        first_reply = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
        return json.dumps(conversation[:first_reply], sort_keys=True)

    shown = {opening(c) for c in demonstrations}
    assert not [t.task_id for d in DOMAINS for t in eval_set(d, HELD_OUT) if opening([*t.messages, {"role": "assistant"}])
                in shown]


class ScriptedChat:
    """Replies from a script of functions of the conversation so far; records every prompt it was given."""

    def __init__(self, *script) -> None:
        self.script = list(script)
        self.prompts: list[list[dict]] = []

    async def chat(self, messages, tools, sampling: SamplingParams) -> Reply:
        self.prompts.append([dict(m) for m in messages])
        reply = self.script.pop(0)(messages)
        reply.call_index = len(self.prompts) - 1
        return reply


def lookups(*keys: str) -> Reply:
    return Reply("", tool_calls=[{"id": f"call_{i}", "type": "function", "function": {
        "name": "lookup", "arguments": json.dumps({"key": k})}} for i, k in enumerate(keys)])


def agent_task(keys: int = 2):
    rng = random.Random(3)
    while True:
        task = agent.make(rng, "a")
        if len(task.values) == keys:
            return task


def answer_from_tools(messages) -> Reply:
    found = [m["content"] for m in messages if m["role"] == "tool"]
    return Reply("Answer: " + " ".join(found))


def test_an_agent_episode_solves_a_task_with_parallel_lookups():
    task = agent_task(2)
    keys = list(task.values)
    llm = ScriptedChat(lambda m: lookups(*keys), answer_from_tools)
    episode = asyncio.run(run_episode(task, llm, SamplingParams(), tool_latency_s=0.0))
    assert episode.reward == 1.0 and episode.turns == 2 and episode.tool_rounds == 1
    assert episode.process_rewards == {} and not episode.failed
    tool_messages = [m for m in llm.prompts[1] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [task.values[k] for k in keys]


def test_parallel_lookups_run_concurrently_and_one_by_one_do_not(monkeypatch):
    """Lookups of one turn overlap (counted while they sleep, whatever the machine's speed); one by one, they do
    not, and the episode lasts at least their latencies end to end."""
    task = agent_task(3)
    keys = list(task.values)
    latency = 0.05

    class Counting(ToolEnvironment):
        in_flight = peak = 0

        async def _lookup(self, call):
            Counting.in_flight += 1
            Counting.peak = max(Counting.peak, Counting.in_flight)
            try:
                return await super()._lookup(call)
            finally:
                Counting.in_flight -= 1

    monkeypatch.setattr(rollout_agent, "ToolEnvironment", Counting)

    def played(*script) -> tuple[int, float]:
        Counting.peak = 0
        episode = asyncio.run(run_episode(task, ScriptedChat(*script), SamplingParams(), tool_latency_s=latency))
        assert episode.reward == 1.0
        return Counting.peak, episode.seconds

    answer = Reply("Answer: " + " ".join(task.values.values()))
    together, _ = played(lambda m: lookups(*keys), lambda m: answer)
    apart, seconds = played(*(lambda m, k=k: lookups(k) for k in keys), lambda m: answer)
    assert together == 3 and apart == 1 and seconds >= 3 * latency


def test_malformed_calls_and_silent_replies_cost_a_process_reward():
    task = agent_task(2)
    keys = list(task.values)
    broken = Reply('<tool_call>{"name": "lookup"', malformed_tool_call=True)
    llm = ScriptedChat(lambda m: broken, lambda m: lookups(*keys), answer_from_tools)
    episode = asyncio.run(run_episode(task, llm, SamplingParams(), tool_latency_s=0.0))
    assert episode.reward == 1.0 and episode.process_rewards == {0: MALFORMED_PENALTY}
    assert llm.prompts[1][-1] == {"role": "user", "content": FORMAT_HINT}

    silent = asyncio.run(run_episode(task, ScriptedChat(lambda m: Reply("")), SamplingParams(), tool_latency_s=0.0))
    assert silent.reward == 0.0 and silent.process_rewards == {0: MALFORMED_PENALTY}
    wrong = asyncio.run(run_episode(task, ScriptedChat(lambda m: Reply("Answer: none")), SamplingParams(),
                                    tool_latency_s=0.0))
    assert wrong.reward == 0.0 and wrong.process_rewards == {}


def test_bad_tool_arguments_are_penalised_by_the_environment():
    task = agent_task(2)
    key = next(iter(task.values))
    outcome = asyncio.run(ToolEnvironment(task, latency_s=0.0).run([
        {"id": "1", "function": {"name": "lookup", "arguments": "{not json"}},
        {"id": "2", "function": {"name": "search", "arguments": json.dumps({"key": "cup"})}},
        {"id": "3", "function": {"name": "lookup", "arguments": json.dumps({"key": "no-such-key"})}},
        {"id": "4", "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}]))
    assert outcome.process_reward == 2 * MALFORMED_PENALTY       # an unknown key is well-formed, just unlucky
    assert outcome.found == {key: task.values[key]}
    assert [text.startswith("error") for _, text in outcome.results] == [True, True, True, False]


def test_one_by_one_lookups_trigger_the_context_rewrite():
    task = agent_task(3)
    keys = list(task.values)
    llm = ScriptedChat(*(lambda m, k=k: lookups(k) for k in keys), lambda m: Reply(
        "Answer: " + " ".join(task.values.values())))
    episode = asyncio.run(run_episode(task, llm, SamplingParams(), tool_latency_s=0.0))
    assert episode.reward == 1.0 and episode.context_rewrites >= 1
    last = llm.prompts[-1]
    assert last[: len(task.messages)] == task.messages and last[-1]["content"].startswith("Known: ")
    assert not any(m["role"] == "tool" for m in last)           # the exchange was replaced by the note


class AnsweringChat:
    """Answers reasoning tasks right when the sampling seed is even (greedy: always); records the sampling used."""

    def __init__(self) -> None:
        self.calls: list[SamplingParams] = []

    async def chat(self, messages, tools, sampling: SamplingParams) -> Reply:
        self.calls.append(sampling)
        task = next(t for t in eval_set("reasoning", HELD_OUT) if t.messages == messages)
        right = sampling.temperature == 0 or sampling.seed % 2 == 0
        return Reply(f"Answer: {task.answer if right else -1}")


def test_evaluation_reads_seeded_samples_or_one_greedy_episode_per_task():
    from forge.rollout.evaluate import evaluate_with

    chat = AnsweringChat()
    assert asyncio.run(evaluate_with(chat, ("reasoning",), size=6, temperature=1.0, samples=4, seed=10)) == {
        "reasoning": 0.5}
    assert sorted(c.seed for c in chat.calls) == list(range(10, 34)) and {c.temperature for c in chat.calls} == {1.0}
    chat = AnsweringChat()
    assert asyncio.run(evaluate_with(chat, ("reasoning",), size=6, samples=4)) == {"reasoning": 1.0}
    assert len(chat.calls) == 6 and all(c.temperature == 0 and c.seed is None for c in chat.calls)
    with pytest.raises(ValueError):
        asyncio.run(evaluate_with(chat, ("reasoning",), size=6, samples=0))


def long_task(keys: int, page_lines: int = long.PAGE_LINES):
    rng = random.Random(11)
    while True:
        task = long.make(rng, "l", page_lines)
        if len(task.values) == keys:
            return task


def colors_read(messages) -> dict[str, list[str]]:
    """What the records in ``messages`` state plainly ("The cup is red."), by object."""
    stated: dict[str, list[str]] = {}
    for message in messages:
        if message["role"] == "tool":
            for line in message["content"].splitlines():
                words = line.rstrip(".").split()
                if words[0] == "The":
                    stated.setdefault(words[1], []).append(words[3])
    return stated


def test_a_long_page_states_its_fact_once_among_records_of_the_same_kinds():
    rng = random.Random(2)
    for index in range(40):
        task = long.make(rng, f"l{index}", page_lines=60)
        colors = task.answer.split()
        assert task.tools == [long.RECORDS] and task.messages[0]["content"].startswith("Find the colors of ")
        for (key, page), color in zip(task.values.items(), colors, strict=True):
            lines = page.splitlines()
            assert len(lines) == 60 and lines.count(long.fact(key, color)) == 1
            stated = colors_read([{"role": "tool", "content": page}])
            assert stated[key] == [color], "the asked object is stated plainly only by its fact"
            assert not set(stated) & (set(task.values) - {key}), "no other asked object is stated plainly"
            assert sum(f" {key} " in line for line in lines) > 1, "other owners' records name the same kind"
    again = long.make(random.Random(7), "same", 30)
    assert again.values == long.make(random.Random(7), "same", 30).values
    assert next(task_stream(("long",), seed=0, page_lines=5)).values.popitem()[1].count("\n") == 4
    with pytest.raises(ValueError, match="at least one line"):
        make_task("long", random.Random(0), "x", page_lines=0)


def answer_from_stated_facts(task):
    return lambda messages: Reply("Answer: " + " ".join(colors_read(messages)[k][0] for k in task.values))


def test_a_long_episode_keeps_each_fact_across_the_later_pages():
    task = long_task(3)
    keys = list(task.values)
    llm = ScriptedChat(*(lambda m, k=k: lookups(k) for k in keys), answer_from_stated_facts(task))
    episode = asyncio.run(run_episode(task, llm, SamplingParams(), tool_latency_s=0.0))
    assert episode.reward == 1.0 and episode.tool_rounds == 3 and episode.context_rewrites == 2
    last = [m for m in llm.prompts[-1] if m["role"] == "tool"]
    assert last[-1]["content"] == task.values[keys[-1]], "the latest page stays whole"
    for message, key, color in zip(last[:-1], keys[:-1], task.answer.split()[:-1], strict=True):
        lines = message["content"].splitlines()
        assert long.fact(key, color) in lines, "the fact is kept"
        assert lines and all(any(f" {k} " in line for k in keys) for line in lines)
        assert len(lines) < len(task.values[key].splitlines()), "the older pages were cut"
    whole = sum(len(task.values[k]) for k in keys)
    assert sum(len(m["content"]) for m in last) < 0.6 * whole


def test_long_lookups_in_one_round_leave_the_pages_whole():
    task = long_task(2)
    keys = list(task.values)
    llm = ScriptedChat(lambda m: lookups(*keys), answer_from_stated_facts(task))
    episode = asyncio.run(run_episode(task, llm, SamplingParams(), tool_latency_s=0.0))
    assert episode.reward == 1.0 and episode.context_rewrites == 0
    assert [m["content"] for m in llm.prompts[-1] if m["role"] == "tool"] == [task.values[k] for k in keys]
