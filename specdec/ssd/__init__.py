"""Speculative speculative decoding (SSD, the Saguaro algorithm).

While the target verifies round t, a drafter in its own process prepares round t+1's
speculation for each likely verification outcome (k accepted, then token b), so that a correct
guess costs no drafting time on the target's critical path.

  fanout.py   how many candidate tokens to prepare after each k (the budget B split up)
  tree.py     positions and attention masks for drafting all branches in one cache row
  cache.py    the outcome-keyed speculation cache
  protocol.py the worker's configuration and every message between the two processes
  channel.py  carrying messages between the processes over one TCP connection
  state.py    the worker's state for one sequence (speculations, slots, tokens held ahead)
  worker.py   the drafter process: trunk pass, tree drafting, lookups, backup drafting
  client.py   the target's side: owns the worker process (start, watch, restart, stop)
  drafter.py  the Drafter the speculative round talks to
"""
