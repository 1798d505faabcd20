"""Real models built from code and configs with random weights (nothing is downloaded), small
enough to compile in seconds: Hugging Face transformers and torchvision, as users bring them.

`MODELS[name]()` gives (model in eval mode, example inputs). Shared by the model-zoo test and
the model benchmark."""
from __future__ import annotations

import torch


def import_torchvision():
    """torchvision, importable with the CPU torch wheel. PyPI's torchvision wheel is built for
    CUDA torch: its C++ ops cannot load here, and `import torchvision` then fails registering
    fake kernels for `torchvision::nms` / `qnms`. Declaring those two schemas (no kernels: calling
    them raises) lets the pure-Python models import; nothing here uses those ops."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    import sys
    for name in [n for n in sys.modules if n.startswith("torchvision")]:
        del sys.modules[name]
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import_torchvision.library = library  # kept alive: dropping it unregisters the schemas
    import torchvision
    return torchvision


import_torchvision()  # before transformers, which imports torchvision when it is installed


class Fn(torch.nn.Module):
    """A function as a module (what tracea.compile and torch.export take)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _tokens(batch=2, seq=32, vocab=1000):
    return (torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1)),)


def _image(size=64, batch=1):
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def bert():
    import transformers as T
    cfg = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       vocab_size=1000, max_position_embeddings=64)
    return T.BertModel(cfg), _tokens()


def gpt2():
    import transformers as T
    cfg = T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=64, use_cache=False,
                       bos_token_id=0, eos_token_id=0)
    return T.GPT2Model(cfg), _tokens()


def vit_hf():
    import transformers as T
    cfg = T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)
    return T.ViTModel(cfg), _image(32, 2)


def t5_encoder():
    import transformers as T
    cfg = T.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000)
    return T.T5EncoderModel(cfg), _tokens()


def llama():
    """A Llama-style decoder: RMSNorm, rotary embeddings, SiLU-gated MLP, grouped-query causal
    attention."""
    import transformers as T
    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64, use_cache=False)
    return T.LlamaModel(cfg), _tokens()


def resnet50():
    return import_torchvision().models.resnet50(num_classes=10), _image(64)


def mobilenet_v3():
    return import_torchvision().models.mobilenet_v3_small(num_classes=10), _image(64)


def efficientnet():
    return import_torchvision().models.efficientnet_b0(num_classes=10), _image(64)


def convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    import_torchvision()
    return ConvNeXt([CNBlockConfig(32, 64, 1), CNBlockConfig(64, None, 1)], num_classes=10), _image(64)


def vit_tv():
    VisionTransformer = import_torchvision().models.VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                             num_classes=10), _image(32, 2)


def swin():
    SwinTransformer = import_torchvision().models.SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                           num_classes=10), _image(64)


MODELS = {f.__name__: f for f in (bert, gpt2, vit_hf, t5_encoder, llama, resnet50, mobilenet_v3, efficientnet,
                                  convnext, vit_tv, swin)}


def build(name: str):
    """(model in eval mode, example inputs) of MODELS[name]."""
    return prepared(MODELS[name])


def prepared(make):
    """make() -> (model, inputs), in eval mode. Weights some builders zero-initialize (torchvision
    ViT's head) are made random, so that every output depends on the whole model."""
    torch.manual_seed(0)
    model, inputs = make()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.05)
        for m in model.modules():  # batch norms with statistics of their own, not 0 / 1
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval(), inputs
