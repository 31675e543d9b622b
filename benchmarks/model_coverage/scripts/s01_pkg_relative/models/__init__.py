from .factory import build_model
from .preact import PreActNet
