"""Pure decisions: what follows an incident. `ladder.decide` is the one entry; `process`
(rung 1) and `nodes` (rungs 2 and 3) are its rungs; `precheck` judges a node's health."""
