"""rollstream consumer: the batcher that turns trajectory streams into trainer batches."""

from consumer.batch import Batch, Entry
from consumer.batcher import Batcher

__all__ = ["Batch", "Batcher", "Entry"]
