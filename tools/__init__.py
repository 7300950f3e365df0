"""Development tools, run from the repository's root as `python -m tools.<name>`.

box_speed        how fast this machine compiles right now (`.ci/run` prints it)
compile_profile  the test suite's JAX time by function (a pytest plugin)
jit_mappings     memory mappings per compiled program
prompt_bucket    what the prompt-bucket floor costs 10^5 short rows

Each module's docstring has its command and what it prints. User benchmarks
are in `benchmarks/`.
"""
