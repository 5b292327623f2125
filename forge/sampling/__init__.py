"""How a token is drawn from the model's logits, apart from the network that computes them: the sampling parameters
and the draw (``sampling``), the edits made to a token's logits before it (``logit_edits``: min_tokens, grammars,
logit_bias, penalties), structured output's grammars (``grammar``) and the bounds a grammar keeps before anything
compiles it (``bounds``), and the sampling parameters on the wire (``wire``). The actors draw with these, the
learner replays them, the gateway and the rollout drivers write them."""
