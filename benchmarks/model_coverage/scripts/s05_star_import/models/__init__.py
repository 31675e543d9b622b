from .mini import *
