"""User benchmarks, run from the repository's root as `python -m benchmarks.<name>`.

decode           generate vs speculative_generate, measured beside the cost
                 model's prediction; --batches (speedup against batch size)
                 and --mesh (per-device memory and collectives per mesh;
                 its machinery is sharded.py; gpu_run.sh runs it on an
                 accelerator host)
sampling         the sort-free top-k / top-p transform at real vocabulary sizes
self_draft       alpha, c and speedup of every SelfDraft depth
tree_compile     what a draft tree's size costs the compile and a call
reduced_vocab    a reduced-vocabulary draft head's c and alpha
vs_transformers  specjax vs Hugging Face transformers, same weights

Each module's docstring has its command and what it prints; results they
wrote are under results/ (see each study's README.md). Development tools
are in tools/.
"""

import logging

# As in experiments/__init__.py: absl's app.run logs at INFO, and JAX's note
# of each accelerator it does not find would open every CPU run.
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
