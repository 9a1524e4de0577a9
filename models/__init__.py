"""The encoder, written from scratch as the textbook describes it."""

from models.attention import MultiHeadAttention
from models.config import EncoderConfig
from models.encoder import Encoder, EncoderLayer, EncoderOutput, SentenceEncoder
from models.heads import SequenceClassifier
from models.weights import LoadedModel, load_pretrained

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
    "LoadedModel",
    "MultiHeadAttention",
    "SentenceEncoder",
    "SequenceClassifier",
    "load_pretrained",
]
