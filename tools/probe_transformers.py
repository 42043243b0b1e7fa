# Copies transformers' DeepSeek-V4 sources and a saved tiny checkpoint's key list to $OUT.
import os, shutil, json, inspect
import transformers
from transformers.models import deepseek_v4 as m
out = os.environ["OUT"]
d = os.path.dirname(m.__file__)
for f in os.listdir(d):
    if f.endswith(".py"):
        shutil.copy(os.path.join(d, f), os.path.join(out, f))
print(transformers.__version__)
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
cfg = DeepseekV4Config()
print(json.dumps(cfg.to_dict(), indent=1, default=str)[:6000])
