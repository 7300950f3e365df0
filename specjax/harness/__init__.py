"""The research harness: machinery for measuring and reproducing, above the
core (`specjax`) and the oracle (`specjax.lab`, `specjax.testing`).

  zoo              named models trained on demand on the built-in corpus
  drafts           the one draft registry: a spec ("self:2", "bigram",
                   "distilled-draft-0.1m@target-3m", a checkpoint) -> a draft
  measure          timers and the cost model of the compiled loop
  autotune         `Goodput` rules priced on this machine (gamma="auto"),
                   or from a device's roofline
  roofline         bytes and FLOPs per pass and round, the roofline model
  policy_sim       the planned draft-length policy simulated on rows of
                   given acceptance (counts, no timer)
  sweep            the measurement grid behind the paper figures
  figures          rows, plots and tables from a sweep's results
  expected_tokens  Rao-Blackwellised expected tokens per round
  distortion       per-token TV of lossy verifiers
  textgen          text in, text out, for the command line and notebooks

The core never imports this package.
"""
