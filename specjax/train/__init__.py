"""Training: AdamW, pluggable losses, data-parallel steps, orbax checkpoints."""

from specjax.train.checkpoint import CheckpointError
from specjax.train.checkpoint import Checkpointer
from specjax.train.checkpoint import load_model
from specjax.train.losses import LossFn
from specjax.train.losses import bits_and_bytes
from specjax.train.losses import next_token_loss
from specjax.train.optim import make_optimizer
from specjax.train.parallel import make_mesh
from specjax.train.trainer import init_state
from specjax.train.trainer import make_eval_step
from specjax.train.trainer import make_train_step
from specjax.train.trainer import model_config_from
from specjax.train.trainer import train
from specjax.train.distill import DIVERGENCES
from specjax.train.distill import distillation_loss
from specjax.train.distill import mean_tv
from specjax.train.distill import teacher_corpus
from specjax.train.exit_adapter import exit_adapter_loss
from specjax.train.exit_adapter import load_exit_adapter
from specjax.train.exit_adapter import train_exit_adapter
from specjax.train.eagle import eagle_loss
from specjax.train.eagle import load_head
from specjax.train.eagle import train_head
