"""Generated training programs over Hugging Face ``transformers`` models: code this project did not write.

The twin of ``model_programs.py`` (whose hooks, training loop and comparison it reuses): a program builds a tiny
GPT-2, BERT, Llama, T5 or ViT from a config (random weights, no download), asks for its hidden states (the
activations that get hooks by hand and the names the lens shows), sometimes with dropout (the lens must draw no
random number: the runs are compared value for value), torch's SDPA or the eager attention, and activation
checkpointing both ways (``gradient_checkpointing_enable``), hooks it every way ``model_programs`` does and trains
it a few steps.  Every statement the lens makes is checked against torch, as there.

``python tests/hf_programs.py --programs 100 --seed 0`` runs a campaign (needs ``pip install transformers``;
the test suite runs a few seeds only where it is installed).
"""

from __future__ import annotations

import sys
import warnings

import model_programs
from programs import Program

MODELS = ("gpt2", "bert", "llama", "t5", "vit")


class HFGenerator(model_programs.ModelGenerator):
    """A tiny transformers model, hooks on it, and 1-3 unrolled training steps."""

    def generate(self) -> Program:
        rng = self.rng
        self.kind = rng.choice(MODELS)
        self._hf(self.kind)
        self.lines.append(f"model = nn.ModuleList([{', '.join(self.tops)}])")
        self._names()
        for _ in range(rng.choice([0, 1, 2, 3, 4, 5])):
            self.hook()
        self.train()
        return Program(self.lines, self.params, self.seed)

    def _hf(self, kind: str) -> None:
        rng = self.rng
        layers = rng.choice([1, 2])
        dropout = rng.choice([0.0, 0.0, 0.1])
        attention = rng.choice(["sdpa", "eager"])
        checkpointing = rng.choice([None, None, True, False])  # use_reentrant, or no checkpointing
        self.lines.insert(0, "import transformers")
        self.lines.insert(1, "transformers.logging.set_verbosity_error()")
        config = {
            "gpt2": f"transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer={layers}, n_head=2, "
                    f"resid_pdrop={dropout}, embd_pdrop={dropout}, attn_pdrop={dropout}, "
                    f"bos_token_id=0, eos_token_id=0)",
            "bert": f"transformers.BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers={layers}, "
                    f"num_attention_heads=2, intermediate_size=16, max_position_embeddings=8, num_labels=3, "
                    f"hidden_dropout_prob={dropout}, attention_probs_dropout_prob={dropout})",
            "llama": f"transformers.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16, "
                     f"num_hidden_layers={layers}, num_attention_heads=2, num_key_value_heads=1, "
                     f"max_position_embeddings=8, attention_dropout={dropout}, bos_token_id=0, eos_token_id=0, "
                     f"tie_word_embeddings={rng.random() < 0.5})",
            "t5": f"transformers.T5Config(vocab_size=11, d_model=8, d_kv=4, d_ff=16, num_layers={layers}, "
                  f"num_heads=2, dropout_rate={dropout}, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)",
            "vit": f"transformers.ViTConfig(image_size=8, patch_size=4, num_channels=2, hidden_size=8, "
                   f"num_hidden_layers={layers}, num_attention_heads=2, intermediate_size=16, num_labels=3, "
                   f"hidden_dropout_prob={dropout}, attention_probs_dropout_prob={dropout})",
        }[kind]
        model_class = {"gpt2": "GPT2LMHeadModel", "bert": "BertForSequenceClassification",
                       "llama": "LlamaForCausalLM", "t5": "T5ForConditionalGeneration",
                       "vit": "ViTForImageClassification"}[kind]
        self.lines.append(f"config = {config}")
        self.lines.append(f"config._attn_implementation = {attention!r}")
        self.define("net", f"transformers.{model_class}(config)")
        if checkpointing is not None:
            self.lines.append(f"net.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                              f"{{'use_reentrant': {checkpointing}}})")
        if rng.random() < 0.25:  # the PEFT pattern: embeddings' output made to require grad by a forward hook
            self.lines.append("net.enable_input_require_grads()")
        if kind != "vit" and rng.random() < 0.15:  # a frozen embedding (its hooks cannot be registered: the same error both ways)
            self.lines.append("net.get_input_embeddings().weight.requires_grad_(False)")
        autocast = kind != "vit" and rng.random() < 0.2  # bf16 autocast around the forward
        self.depth = layers  # hidden states a{k}_0 .. a{k}_layers

        def forward(k: int) -> list[str]:
            states = ", ".join(f"a{k}_{j}" for j in range(layers + 1))
            if kind == "vit":
                inputs = [f"x{k} = torch.randn(2, 2, 8, 8)", f"y{k} = torch.randint(0, 3, (2,))"]
                call = f"net(pixel_values=x{k}, labels=y{k}, output_hidden_states=True)"
            elif kind == "bert":
                inputs = [f"tok{k} = torch.randint(0, 11, (2, 5))", f"y{k} = torch.randint(0, 3, (2,))"]
                call = f"net(input_ids=tok{k}, labels=y{k}, output_hidden_states=True)"
            else:
                inputs = [f"tok{k} = torch.randint(1, 11, (2, 5))"]
                cache = ", use_cache=False" if kind != "t5" else ""
                call = f"net(input_ids=tok{k}, labels=tok{k}, output_hidden_states=True{cache})"
            hidden = "encoder_hidden_states" if kind == "t5" else "hidden_states"
            with_autocast = "with torch.autocast('cpu', dtype=torch.bfloat16): " if autocast else ""
            return inputs + [f"{with_autocast}o{k} = {call}", f"{states} = o{k}.{hidden}", f"loss{k} = o{k}.loss"]
        self.forward_lines.append(forward)


def check(seed: int, cross_check: bool = False) -> tuple[Program, list[str]]:
    return model_programs.check(seed, cross_check, HFGenerator)


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", "`gradient_checkpointing_enable` is deprecated", FutureWarning)
    return model_programs.main(argv, HFGenerator, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
