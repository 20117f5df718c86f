"""rollstream consumer: the batcher that turns trajectory streams into trainer batches, and
the trainer's handle on the model servers' weights."""

from consumer.batch import Batch, Entry
from consumer.batcher import Batcher
from consumer.servers import ModelServers

__all__ = ["Batch", "Batcher", "Entry", "ModelServers"]
