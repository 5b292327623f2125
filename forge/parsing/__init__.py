"""Model output text to an assistant message: tool-call syntaxes of each model family (``forge.parsing.tools``),
reasoning syntaxes (``forge.parsing.reasoning``) and the completion parser that composes them
(``forge.parsing.completion``). Shared by the gateway, which parses every call, and the agent side's evaluation,
which parses replies sampled without the gateway."""
