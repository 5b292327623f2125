"""Structured output's guards: the compilation of a grammar against a tokenizer in a separate process under a memory
limit (``sandbox``), and the check of a grammar off the wire before a service takes it (``check``: its form, the
bounds it must keep, ``forge.sampling.bounds``, then the sandbox).

A grammar engine allocates what a schema asks for: ``minItems: 1000000000`` is a few bytes of JSON and gigabytes of
grammar, and llguidance aborts the whole process when such an allocation fails. Every process that compiles a
grammar (the gateway, an actor, the learner) checks its bounds first, and the ones that accept grammars from the
network compile each new one in the sandbox before they take it. This package imports neither torch nor llguidance
at module level, so the sandbox's process starts light."""
