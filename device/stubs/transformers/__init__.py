# The device image's transformers refuses to import (it wants huggingface-hub<2, the image has 2.4);
# the pre-tokenized run needs no HF tokenizer, and Megatron treats a missing transformers as optional.
raise ModuleNotFoundError("transformers is stubbed out for the pre-tokenized Megatron run", name="transformers")
