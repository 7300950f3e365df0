r"""What the EAGLE head's input norms and loss weights buy, at equal training.

  python benchmarks/eagle_head_ablation.py [NUM_STEPS] [ONLY]   # 300, all

ONLY: comma-separated words; only the variants whose name contains one of
them are trained (e.g. `zeroed,narrow`); the drafts' rows always print.

On the quick job's target-3m (from the zoo), trains heads that differ in
one choice each, with the same batches and budget as `experiments/eagle.py`
(16 x 256 bytes a step), and reports each one's teacher-forced acceptance
on held-out text: the mean over positions of sum_x min(p, q), where q is the
head's law from the target's true features of the text (what its first
draft in a round sees; gamma = 1, T = 1) and the argmax agreement (T = 0),
next to the zoo's distilled drafts of the same budget. Counts, not timings.

  no input norms, 1 : 1   the head before the input norms, loss weights 1 : 1
  norms, 1 : 1            input norms (the library's head), weights 1 : 1
  norms, 10 : 1           the library's defaults (EAGLE's ratio)
  norms, 30 : 1           more regression still
  norms, KL only          no feature regression
  ... MLP 1,024           a wider MLP (more parameters)
  ... two blocks          a second block (more parameters)
  ... lr 1e-2             the peak learning rate of 1e-2, not 3e-3
  ... output norm         a learned norm on the output, as the target's
                          features leave its final norm (MLP 319: 560,959)
  ... features zeroed     the library's head reading zeros for the target's
                          features (a control: what the features add)
  narrow, two blocks      fc(2D -> 128), two blocks of width 128, fc(128 -> D):
                          depth at the library head's size (562,048)
  ... features zeroed     the same, reading zeros for the features
  ... no regression       the narrow head trained on the KL term alone
  ... TV for KL           the narrow head with TV (1 - acceptance) in the
                          KL's place, weights 10 : 1
  narrow, three blocks    three blocks of width 128, MLP 336 (558,832)
  ... output norm         the narrow head with an output norm (562,560)
  ... 30 : 1              the narrow head with more regression
  ... regression only     the narrow head without the KL term
  ... output norm from the target's   the output norm starts as a copy of
                          the target's final norm (then trained)
  small: width 64 / 48    narrow heads at distilled-draft-0.1m's size
                          (117,440 / 118,016); width 64 also features zeroed
  narrow, whitened output the narrow head's output g mapped to features by
                          a fixed f = V diag(1 / max(s, 0.05)) g, from the
                          SVD W = U diag(s) V^T of the target's LM head, so
                          that logits W f (U g where s >= 0.05) are about
                          as well conditioned as a draft's own unembedding
                          (s spans 6.66 to 0.001 on the quick target): KL
                          only, and 10 : 1
  narrow, own unembedding a diagnostic, not a head: the narrow head with a
                          final norm and its own unembedding (width -> V:
                          256 + 33,411 in place of fc(128 -> D)'s 33,024),
                          scoring tokens itself as a draft does, KL only;
                          also with the features zeroed (a token model
                          reading the target's embeddings)
  narrow, token and position normed apart   the target's token and
                          position embeddings each through a norm of its
                          own, not their sum through one (fc(3D -> 128),
                          MLP 576: 562,432), 10 : 1
  narrow, own token embedding   a token embedding of the head's own
                          (V x 128, trained) in place of the target's; the
                          target's position embedding stays (MLP 576:
                          562,304), 10 : 1, the target's LM head
  narrow, small fc init   fc initialised at std 0.001 (not 0.02), so that
                          the residual stream starts at a draft's
                          embedding scale (RMS about 0.02, not 0.45)
  narrow, RoPE            'llama' blocks (RoPE, RMSNorm, SwiGLU MLP 429)
                          reading the target's token embedding alone, so
                          order comes from RoPE, not from the target's
                          learned position embedding; also features zeroed
"""

import dataclasses
import os
import shlex
import shutil
import sys
import tempfile

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specjax import data  # noqa: E402
from specjax.models import eagle  # noqa: E402
from specjax.models import transformer  # noqa: E402
from specjax.train import distill  # noqa: E402
from specjax.train import eagle as eagle_train  # noqa: E402
from specjax.train import losses  # noqa: E402
from specjax.train import recipes  # noqa: E402
from specjax.train import trainer  # noqa: E402
from configs import reproduce  # noqa: E402
from experiments import eagle as eagle_experiment  # noqa: E402


def head_of(module_type):
  """An `EagleHead` whose module is `module_type`."""
  return type(module_type.__name__.replace("Module", "Head"),
              (eagle.EagleHead,), {"module_type": module_type})


class NoNormsModule(eagle.EagleHeadModule):
  """The head without its input norms (fc reads the raw pair)."""

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    del self.feature_norm, self.embed_norm  # not counted, not trained

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT, cache):
    x_BxTxD = self.fc(jnp.concatenate([features_BxTxD, embeds_BxTxD], -1))
    return self.block(x_BxTxD, positions_BxT, cache, 0)


NoNormsHead = head_of(NoNormsModule)


class TwoBlocksModule(eagle.EagleHeadModule):
  """The head with a second block after the first."""

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    self.second = transformer.Block(config, rngs)

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT, cache):
    assert cache is None  # teacher-forced only: one KV layer in an EagleCache
    x_BxTxD, _ = super().__call__(features_BxTxD, embeds_BxTxD,
                                  positions_BxT, None)
    return self.second(x_BxTxD, positions_BxT, None, 0)


TwoBlocksHead = head_of(TwoBlocksModule)


class _ZeroFeatures:
  """Mixin: a head module reading zeros where the target's features go."""

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT, cache):
    return super().__call__(jnp.zeros_like(features_BxTxD), embeds_BxTxD,
                            positions_BxT, cache)


class ZeroFeaturesModule(_ZeroFeatures, eagle.EagleHeadModule):
  """The library's head, features zeroed."""


ZeroFeaturesHead = head_of(ZeroFeaturesModule)


class NarrowModule(eagle.EagleHeadModule):
  """Depth at equal size: fc(2D -> 128), two blocks of width 128 (4 heads,
  MLP 640), fc(128 -> D) back to the target's feature space."""
  width, mlp_dim, num_blocks, num_heads = 128, 640, 2, 4
  flavour = None  # None: the target's

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    inner = dataclasses.replace(config, d_model=self.width,
                                num_heads=self.num_heads,
                                num_kv_heads=self.num_heads,
                                head_dim=self.width // self.num_heads,
                                mlp_dim=self.mlp_dim,
                                num_layers=self.num_blocks,
                                flavour=self.flavour or config.flavour)
    del self.block  # replaced by the narrow blocks; not counted
    self.fc = transformer._linear(config, 2 * config.d_model, self.width, rngs)
    self.blocks = nnx.List([transformer.Block(inner, rngs)
                            for _ in range(self.num_blocks)])
    self.out = transformer._linear(inner, self.width, config.d_model, rngs)

  def inputs(self, features_BxTxD, embeds_BxTxD):
    """`[B, T, width]`: what the first narrow block reads."""
    return self.fc(jnp.concatenate(
        [self.feature_norm(features_BxTxD), self.embed_norm(embeds_BxTxD)],
        -1))

  def output(self, x_BxTxW):
    """The last block's stream to the head's output (features here)."""
    return self.out(x_BxTxW)

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT, cache):
    assert cache is None  # teacher-forced only
    x_BxTxW = self.inputs(features_BxTxD, embeds_BxTxD)
    for layer, block in enumerate(self.blocks):
      x_BxTxW, _ = block(x_BxTxW, positions_BxT, None, layer)
    return self.output(x_BxTxW), None


NarrowHead = head_of(NarrowModule)


class _OutNorm:
  """Mixin: a learned norm on the head's output, as the target's own features
  come out of its final norm (+512 parameters)."""

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    self.out_norm = transformer._norm(config, rngs)

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT, cache):
    predicted_BxTxD, cache = super().__call__(features_BxTxD, embeds_BxTxD,
                                              positions_BxT, cache)
    return self.out_norm(predicted_BxTxD), cache


class OutNormModule(_OutNorm, eagle.EagleHeadModule):
  """The library's head with an output norm."""


OutNormHead = head_of(OutNormModule)


class NarrowOutNormModule(_OutNorm, NarrowModule):
  """The narrow head with an output norm."""


NarrowOutNormHead = head_of(NarrowOutNormModule)


class NarrowThreeModule(NarrowModule):
  """Three blocks of width 128 (MLP 336) at the same size (558,832)."""
  mlp_dim, num_blocks = 336, 3


NarrowThreeHead = head_of(NarrowThreeModule)


class Small64Module(NarrowModule):
  """At distilled-draft-0.1m's size: width 64, two blocks, MLP 128 (117,440)."""
  width, mlp_dim = 64, 128


Small64Head = head_of(Small64Module)


class Small64ZeroFeaturesModule(_ZeroFeatures, Small64Module):
  """The width-64 head, features zeroed."""


Small64ZeroFeaturesHead = head_of(Small64ZeroFeaturesModule)


class Small48Module(NarrowModule):
  """At distilled-draft-0.1m's size: width 48 (3 heads, as the draft), two
  blocks, MLP 312 (118,016)."""
  width, mlp_dim, num_heads = 48, 312, 3


Small48Head = head_of(Small48Module)


class NarrowZeroFeaturesModule(_ZeroFeatures, NarrowModule):
  """The narrow head, features zeroed."""


NarrowZeroFeaturesHead = head_of(NarrowZeroFeaturesModule)


class WhitenedNarrowModule(NarrowModule):
  """The narrow head whose output g becomes features through `whitening`
  (a fixed [D, D] array the script sets from the target: not a parameter)."""
  whitening = None

  def __call__(self, features_BxTxD, embeds_BxTxD, positions_BxT, cache):
    g_BxTxD, cache = super().__call__(features_BxTxD, embeds_BxTxD,
                                      positions_BxT, cache)
    return g_BxTxD @ self.whitening.T, cache


WhitenedNarrowHead = head_of(WhitenedNarrowModule)


class OwnUnembedModule(NarrowModule):
  """The narrow head scoring tokens itself: final norm, own unembedding.
  Returns logits `[B, T, V]`, not features (see `ablation_loss`)."""

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    inner = dataclasses.replace(config, d_model=self.width)
    del self.out  # replaced by the unembedding; not counted
    self.final_norm = transformer._norm(inner, rngs)
    self.unembed = transformer._linear(inner, self.width, config.vocab_size,
                                       rngs)

  def output(self, x_BxTxW):
    return self.unembed(self.final_norm(x_BxTxW))


OwnUnembedHead = head_of(OwnUnembedModule)


class OwnUnembedZeroFeaturesModule(_ZeroFeatures, OwnUnembedModule):
  """The own-unembedding narrow head, features zeroed."""


OwnUnembedZeroFeaturesHead = head_of(OwnUnembedZeroFeaturesModule)


class SplitEmbedsModule(NarrowModule):
  """The narrow head reading the target's token and position embeddings
  through norms of their own (not their sum through one): fc(3D -> 128),
  MLP 576 to stay at the narrow head's size. `embeds` is (token, position)."""
  mlp_dim = 576

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    self.position_norm = transformer._norm(config, rngs)
    self.fc = transformer._linear(config, 3 * config.d_model, self.width, rngs)

  def inputs(self, features_BxTxD, embeds):
    tokens_BxTxD, table_BxTxD = embeds
    return self.fc(jnp.concatenate(
        [self.feature_norm(features_BxTxD), self.embed_norm(tokens_BxTxD),
         self.position_norm(table_BxTxD)], -1))


SplitEmbedsHead = head_of(SplitEmbedsModule)


class OwnTokensModule(NarrowModule):
  """The narrow head with a token embedding of its own (V x 128, trained)
  added after fc, which reads the target's position embedding in the
  token embedding's place; MLP 576 to stay at the narrow head's size.
  `embeds` is (token ids, position embedding)."""
  mlp_dim = 576

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    self.tokens = nnx.Embed(config.vocab_size, self.width,
                            embedding_init=nnx.initializers.normal(0.02),
                            rngs=rngs)

  def inputs(self, features_BxTxD, embeds):
    ids_BxT, table_BxTxD = embeds
    return super().inputs(features_BxTxD, table_BxTxD) + self.tokens(ids_BxT)


OwnTokensHead = head_of(OwnTokensModule)


class SmallFcModule(NarrowModule):
  """The narrow head with fc initialised at std 0.001, not 0.02: its output
  then starts at an RMS of about 0.02, as a draft's embeddings do, where
  0.02 over 2D = 512 unit-RMS inputs starts it at about 0.45."""

  def __init__(self, config, rngs):
    super().__init__(config, rngs)
    self.fc = transformer._linear(config, 2 * config.d_model, self.width, rngs,
                                  std=0.001)


SmallFcHead = head_of(SmallFcModule)


class RopeModule(NarrowModule):
  """The narrow head with 'llama' blocks (RoPE, RMSNorm, SwiGLU MLP 429 to
  stay at the narrow head's size), reading the target's token embedding
  alone: order comes from RoPE in its attention, not from the target's
  learned position embedding."""
  flavour, mlp_dim = "llama", 429


RopeHead = head_of(RopeModule)


class RopeZeroFeaturesModule(_ZeroFeatures, RopeModule):
  """The RoPE narrow head, features zeroed."""


RopeZeroFeaturesHead = head_of(RopeZeroFeaturesModule)


def head_inputs(frozen, tokens_BxT, positions_BxT, split):
  """The embeddings a head reads: their sum; (token, position) "split";
  (token ids, position) for "own tokens"; the token's alone for "rope"."""
  if split == "rope":
    return frozen.embed(tokens_BxT)
  if split == "own tokens":
    return tokens_BxT, frozen.pos_embed(positions_BxT)
  if split:
    return frozen.embed(tokens_BxT), frozen.pos_embed(positions_BxT)
  return frozen.embed_inputs(tokens_BxT, positions_BxT)


def ablation_loss(feature_weight, scores_itself, split):
  """`eagle_loss` (forward KL, weight 1) for the modules above that score
  tokens themselves (KL only) or read split embeddings."""
  def loss_fn(module, batch, rng, target):
    del rng
    inputs_BxT, targets_BxT = losses.split_inputs_targets(batch["tokens"])
    frozen = target.module()
    positions_BxT, hidden_BxTxD, teacher_BxTxV = eagle_train.teacher_forcing(
        frozen, inputs_BxT)
    out, _ = module(eagle.shift_features(hidden_BxTxD), jax.lax.stop_gradient(
        head_inputs(frozen, inputs_BxT, positions_BxT, split)),
                    positions_BxT, None)
    mask_BxT = losses.target_mask(targets_BxT,
                                  losses.pad_id_for(teacher_BxTxV.shape[-1]))
    mean = lambda x_BxT: ((x_BxT * mask_BxT).sum()
                          / jnp.maximum(mask_BxT.sum(), 1.0))
    loss = mean(distill.divergence_BxT(
        "forward_kl", teacher_BxTxV, out if scores_itself else frozen.head(out)))
    if feature_weight and not scores_itself:
      loss += feature_weight * mean(jnp.mean(
          eagle_train._smooth_l1(out - hidden_BxTxD), -1))  # pylint: disable=protected-access
    return loss, {}
  return loss_fn


def whitening(target, floor: float = 0.05):
  """M with W M = U diag(s / max(s, floor)), for W = U diag(s) V^T the
  target's tied LM head `[V, D]`: logits of M g are U g (rotated) where s
  is above `floor`."""
  w_VxD = np.asarray(target.module().embed.embedding[...], np.float32)
  _, s_D, vt_DxD = np.linalg.svd(w_VxD, full_matrices=False)
  print("the target's LM head, singular values:", " ".join(
      f"{x:.3f}" for x in s_D[[0, 1, 2, 50, 100, 200, -1]]),
        "(1st, 2nd, 3rd, 51st, 101st, 201st, last)", flush=True)
  return jnp.asarray(vt_DxD.T / np.maximum(s_D, floor))


def teacher_forced(target, logits_fn, windows_NxT):
  """(mean sum_x min(p, q), argmax agreement) past each window's 8th byte."""
  module = target.module()
  positions_NxT, hidden_NxTxD, p_logits_NxTxV = eagle_train.teacher_forcing(
      module, windows_NxT)
  p_NxTxV = jax.nn.softmax(p_logits_NxTxV, -1)
  q_NxTxV = jax.nn.softmax(logits_fn(module, hidden_NxTxD, windows_NxT,
                                     positions_NxT), -1)
  overlap = jnp.minimum(p_NxTxV, q_NxTxV).sum(-1)[:, 8:]
  agree = (p_NxTxV.argmax(-1) == q_NxTxV.argmax(-1))[:, 8:]
  return float(overlap.mean()), float(agree.mean())


def head_logits(head, scores_itself=False, split=False):
  def fn(module, hidden_NxTxD, windows_NxT, positions_NxT):
    predicted_NxTxD, _ = head.module()(
        eagle.shift_features(hidden_NxTxD),
        head_inputs(module, windows_NxT, positions_NxT, split),
        positions_NxT, None)
    return predicted_NxTxD if scores_itself else module.head(predicted_NxTxD)
  return fn


def main():
  num_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
  only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
  target, drafts = eagle_experiment.load_models(num_steps, None)
  heldout = data.stdlib_corpus().tokens("heldout").astype(np.int32)
  windows_NxT = jnp.asarray(data.prompts(heldout, 32, 256, 1))
  config = eagle_train.train_config(target.config)
  config.update_from_flattened_dict(reproduce.head_budget(num_steps))
  config.progress = False
  default = dict(head_type=eagle.EagleHead,
                 feature_weight=eagle_train.FEATURE_WEIGHT,
                 mlp_dim=recipes.EAGLE_HEAD_MLP_DIM, lr=config.optim.lr,
                 divergence="forward_kl", kl_weight=eagle_train.KL_WEIGHT,
                 target_norm=False, scores_itself=False, split=False)
  variants = [
      ("no input norms, 1 : 1", dict(head_type=NoNormsHead,
                                     feature_weight=1.0)),
      ("norms, 1 : 1", dict(feature_weight=1.0)),
      ("norms, 10 : 1 (the library's head)", {}),
      ("norms, 30 : 1", dict(feature_weight=30.0)),
      ("norms, KL only", dict(feature_weight=0.0)),
      ("norms, 10 : 1, MLP 1,024", dict(mlp_dim=1024)),
      ("norms, 10 : 1, two blocks", dict(head_type=TwoBlocksHead)),
      ("norms, 10 : 1, lr 1e-2", dict(lr=1e-2)),
      # MLP 319 keeps the head at draft-0.5m's size with the norm's 512.
      ("norms, 10 : 1, output norm", dict(head_type=OutNormHead,
                                          mlp_dim=319)),
      ("norms, 10 : 1, features zeroed", dict(head_type=ZeroFeaturesHead)),
      ("narrow, two blocks", dict(head_type=NarrowHead)),
      ("narrow, two blocks, features zeroed",
       dict(head_type=NarrowZeroFeaturesHead)),
      ("narrow, two blocks, no regression (KL only)",
       dict(head_type=NarrowHead, feature_weight=0.0)),
      ("narrow, two blocks, TV for KL",
       dict(head_type=NarrowHead, divergence="tv")),
      ("narrow, three blocks", dict(head_type=NarrowThreeHead)),
      ("narrow, two blocks, output norm", dict(head_type=NarrowOutNormHead)),
      ("narrow, two blocks, 30 : 1", dict(head_type=NarrowHead,
                                          feature_weight=30.0)),
      ("narrow, two blocks, regression only (no KL)",
       dict(head_type=NarrowHead, kl_weight=0.0)),
      ("narrow, two blocks, output norm from the target's",
       dict(head_type=NarrowOutNormHead, target_norm=True)),
      ("small: width 64, two blocks", dict(head_type=Small64Head)),
      ("small: width 64, two blocks, features zeroed",
       dict(head_type=Small64ZeroFeaturesHead)),
      ("small: width 48, two blocks", dict(head_type=Small48Head)),
      ("narrow, whitened output, KL only",
       dict(head_type=WhitenedNarrowHead, feature_weight=0.0)),
      ("narrow, whitened output, 10 : 1", dict(head_type=WhitenedNarrowHead)),
      ("narrow, own unembedding (KL only)",
       dict(head_type=OwnUnembedHead, scores_itself=True)),
      ("narrow, own unembedding, features zeroed (KL only)",
       dict(head_type=OwnUnembedZeroFeaturesHead, scores_itself=True)),
      ("narrow, token and position normed apart",
       dict(head_type=SplitEmbedsHead, split=True)),
      ("narrow, own token embedding",
       dict(head_type=OwnTokensHead, split="own tokens")),
      ("narrow, small fc init", dict(head_type=SmallFcHead)),
      ("narrow, RoPE", dict(head_type=RopeHead, split="rope")),
      ("narrow, RoPE, features zeroed",
       dict(head_type=RopeZeroFeaturesHead, split="rope")),
  ]
  if only:
    variants = [v for v in variants if any(w in v[0] for w in only)]
  if any("whitened" in name for name, _ in variants):
    WhitenedNarrowModule.whitening = whitening(target)
  rows = []
  for name, changes in variants:
    v = dict(default, **changes)
    config.optim.lr = v["lr"]
    head_config = eagle.head_config(target.config, mlp_dim=v["mlp_dim"])
    head_type = v["head_type"]
    workdir = tempfile.mkdtemp()
    try:
      module = head_type.module_type(head_config, nnx.Rngs(config.seed))
      if v["target_norm"]:  # start where the target's h leaves its norm
        nnx.update(module.out_norm,
                   nnx.state(target.module().final_norm, nnx.Param))
      model = head_type.from_module(module)
      head, _ = trainer.train(
          config, workdir, aux=target, model=model,
          loss_fn=(ablation_loss(v["feature_weight"], v["scores_itself"],
                                 v["split"])
                   if v["scores_itself"] or v["split"] else
                   eagle_train.eagle_loss(feature_weight=v["feature_weight"],
                                          kl_weight=v["kl_weight"],
                                          divergence=v["divergence"])))
    finally:
      shutil.rmtree(workdir)
    rows.append((f"head: {name}", head.param_count(),
                 *teacher_forced(target, head_logits(head, v["scores_itself"],
                                                     v["split"]),
                                 windows_NxT)))
    print(*rows[-1], flush=True)
  for name, draft in drafts.items():
    if name != "eagle-head":
      rows.append((name, draft.param_count(), *teacher_forced(
          target, lambda m, h, w, p, d=draft: d.module()(w), windows_NxT)))
  print(f"\nTeacher-forced on 32 held-out windows of 256 bytes, quick "
        f"target-3m, every model trained {num_steps} steps of 16 x 256 "
        f"bytes.\nCommand: python benchmarks/eagle_head_ablation.py "
        f"{num_steps}{' ' + shlex.quote(','.join(only)) if only else ''}\n")
  print("| model | own params | sum min(p, q) (T = 1) | argmax agreement "
        "(T = 0) |\n| --- | --- | --- | --- |")
  for name, params, overlap, agree in rows:
    print(f"| {name} | {params:,} | {overlap:.3f} | {agree:.3f} |")


if __name__ == "__main__":
  main()
