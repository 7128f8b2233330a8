"""The engine simulator: an OpenAI-compatible server that behaves like the engine its command line names.

    python -m specdeploy_engine.sim --port 18000 -- vllm serve MODEL --speculative-config '{…}'

    config = parse_engine_argv(argv)                 # sim/argv.py: the engine's reading, or its refusal
    served = served_model(config, gpu)               # sim/model.py: models, step times, KV cache, acceptance
    result = simulate(served, workload.plan(60))     # sim/virtual.py: the engine core on a virtual clock
    server = SimServer(served, knobs=Knobs())        # sim/server.py: the same core on the real clock

Modules: argv (+ options, flag_tables) read the command line; model times steps with hardware's passes
(a measured H100 table, scaled: not the planner's cost model); engine is the scheduler; metrics (+ exposition) write each engine's Prometheus metrics; knobs
are the run-time controls; openai_api, server and console are what clients and logs see. See
docs/simulator.md.
"""
