"""The load-test backend (``forge-actor --backend loadtest``): tokens at a set pace from no model, so the middleware in
front of the actors can be measured alone (``bench/gateway_load.py``). Training runs refuse it."""
