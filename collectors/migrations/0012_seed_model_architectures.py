"""Seeds the table of model architectures with the models GB10 admins commonly serve.

The entries are a frozen copy of ``collectors/seeds/model_architectures.json`` as it was when
this migration was written, so it writes the same rows whatever that file says later; a later
seed change comes with a migration of its own. Each row is an untouched seed
(``untouched_seed``); a row an admin already holds under the same repo id is left as it is. The
reverse deletes the seed rows no admin has changed since.
"""

from django.db import migrations

SEEDS = [{'repo_id': 'nvidia/gemma-4-26b-a4b-nvfp4',
  'aliases': ['google/gemma-4-26b-a4b-it', 'redhatai/gemma-4-26b-a4b-it-nvfp4',
              'redhatai/gemma-4-26b-a4b-it-fp8-dynamic'],
  'source': 'the attention layers vLLM 0.19-0.33 builds for nvidia/Gemma-4-26B-A4B-NVFP4 '
            '(gemma4.py: 30 layers, 5 sliding-window of 8 KV heads x 256 then 1 full of 2 x 512, '
            'five times; window 1024; 131,072 positions); its hidden sizes are not seeded',
  'config': {'architectures': ['Gemma4ForConditionalGeneration'],
             'model_type': 'gemma4',
             'text_config': {'model_type': 'gemma4_text',
                             'num_hidden_layers': 30,
                             'num_key_value_heads': 8,
                             'head_dim': 256,
                             'global_head_dim': 512,
                             'attention_k_eq_v': True,
                             'num_global_key_value_heads': 2,
                             'sliding_window': 1024,
                             'layer_types': ['sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'full_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'full_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'full_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'full_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'sliding_attention',
                                             'sliding_attention', 'full_attention'],
                             'max_position_embeddings': 131072,
                             'torch_dtype': 'bfloat16'},
             'quantization_config': {'quant_method': 'modelopt', 'quant_algo': 'NVFP4'},
             'sparkops_unknown': ['hidden_size', 'kv_cache_quant_algo']}},
 {'repo_id': 'openai/gpt-oss-120b',
  'aliases': [],
  'source': 'from the published config.json of openai/gpt-oss-120b',
  'config': {'architectures': ['GptOssForCausalLM'],
             'model_type': 'gpt_oss',
             'num_hidden_layers': 36,
             'num_attention_heads': 64,
             'num_key_value_heads': 8,
             'head_dim': 64,
             'hidden_size': 2880,
             'intermediate_size': 2880,
             'num_local_experts': 128,
             'num_experts_per_tok': 4,
             'vocab_size': 201088,
             'max_position_embeddings': 131072,
             'sliding_window': 128,
             'layer_types': ['sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention'],
             'tie_word_embeddings': False,
             'torch_dtype': 'bfloat16',
             'quantization_config': {'quant_method': 'mxfp4'}}},
 {'repo_id': 'openai/gpt-oss-20b',
  'aliases': [],
  'source': 'from the published config.json of openai/gpt-oss-20b',
  'config': {'architectures': ['GptOssForCausalLM'],
             'model_type': 'gpt_oss',
             'num_hidden_layers': 24,
             'num_attention_heads': 64,
             'num_key_value_heads': 8,
             'head_dim': 64,
             'hidden_size': 2880,
             'intermediate_size': 2880,
             'num_local_experts': 32,
             'num_experts_per_tok': 4,
             'vocab_size': 201088,
             'max_position_embeddings': 131072,
             'sliding_window': 128,
             'layer_types': ['sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention',
                             'sliding_attention', 'full_attention', 'sliding_attention',
                             'full_attention', 'sliding_attention', 'full_attention'],
             'tie_word_embeddings': False,
             'torch_dtype': 'bfloat16',
             'quantization_config': {'quant_method': 'mxfp4'}}},
 {'repo_id': 'meta-llama/llama-3.1-8b-instruct',
  'aliases': ['meta-llama/llama-3.1-8b'],
  'source': 'from the published config.json of meta-llama/Llama-3.1-8B-Instruct',
  'config': {'architectures': ['LlamaForCausalLM'],
             'model_type': 'llama',
             'num_hidden_layers': 32,
             'num_attention_heads': 32,
             'num_key_value_heads': 8,
             'hidden_size': 4096,
             'intermediate_size': 14336,
             'vocab_size': 128256,
             'max_position_embeddings': 131072,
             'tie_word_embeddings': False,
             'torch_dtype': 'bfloat16'}},
 {'repo_id': 'meta-llama/llama-3.1-70b-instruct',
  'aliases': ['meta-llama/llama-3.1-70b', 'meta-llama/llama-3.3-70b-instruct'],
  'source': 'from the published config.json of meta-llama/Llama-3.1-70B-Instruct',
  'config': {'architectures': ['LlamaForCausalLM'],
             'model_type': 'llama',
             'num_hidden_layers': 80,
             'num_attention_heads': 64,
             'num_key_value_heads': 8,
             'hidden_size': 8192,
             'intermediate_size': 28672,
             'vocab_size': 128256,
             'max_position_embeddings': 131072,
             'tie_word_embeddings': False,
             'torch_dtype': 'bfloat16'}},
 {'repo_id': 'qwen/qwen3-30b-a3b',
  'aliases': [],
  'source': 'from the published config.json of Qwen/Qwen3-30B-A3B',
  'config': {'architectures': ['Qwen3MoeForCausalLM'],
             'model_type': 'qwen3_moe',
             'num_hidden_layers': 48,
             'num_attention_heads': 32,
             'num_key_value_heads': 4,
             'head_dim': 128,
             'hidden_size': 2048,
             'intermediate_size': 6144,
             'moe_intermediate_size': 768,
             'num_experts': 128,
             'num_experts_per_tok': 8,
             'vocab_size': 151936,
             'max_position_embeddings': 40960,
             'use_sliding_window': False,
             'tie_word_embeddings': False,
             'torch_dtype': 'bfloat16'}},
 {'repo_id': 'nvidia/nvidia-nemotron-nano-9b-v2',
  'aliases': [],
  'source': "NVIDIA's Nemotron-H family: hybrid Mamba-2 / attention models, served by vLLM's "
            'NemotronH',
  'unknown_reason': 'a hybrid Mamba-2 / attention model (NemotronH): vLLM keeps one fixed-size '
                    'state per request for each Mamba layer, not per token, and sizes the '
                    "attention blocks to that state's page, which this planner does not model; "
                    'its layer pattern is not seeded, so read its config.json for the attention '
                    'layers'},
 {'repo_id': 'nvidia/nvidia-nemotron-nano-12b-v2',
  'aliases': [],
  'source': "NVIDIA's Nemotron-H family: hybrid Mamba-2 / attention models, served by vLLM's "
            'NemotronH',
  'unknown_reason': 'a hybrid Mamba-2 / attention model (NemotronH): vLLM keeps one fixed-size '
                    'state per request for each Mamba layer, not per token, and sizes the '
                    "attention blocks to that state's page, which this planner does not model; "
                    'its layer pattern is not seeded, so read its config.json for the attention '
                    'layers'},
 {'repo_id': 'nvidia/nemotron-3-super-120b-a12b-nvfp4',
  'aliases': [],
  'source': "NVIDIA's Nemotron-H family: hybrid Mamba-2 / attention models, served by vLLM's "
            'NemotronH',
  'unknown_reason': 'a hybrid Mamba-2 / attention model (NemotronH): vLLM keeps one fixed-size '
                    'state per request for each Mamba layer, not per token, and sizes the '
                    "attention blocks to that state's page, which this planner does not model; "
                    'its layer pattern is not seeded, so read its config.json for the attention '
                    'layers'}]


def seed_model_architectures(apps, schema_editor):
    ModelArchitecture = apps.get_model("collectors", "ModelArchitecture")
    held = set(ModelArchitecture.objects.values_list("repo_id", flat=True))
    ModelArchitecture.objects.bulk_create([
        ModelArchitecture(
            repo_id=seed["repo_id"], aliases="\n".join(seed["aliases"]),
            config=seed.get("config"), hf_quant_config=seed.get("hf_quant_config"),
            unknown_reason=seed.get("unknown_reason", ""), source=seed["source"],
            untouched_seed=True)
        for seed in SEEDS if seed["repo_id"] not in held
    ])


def delete_untouched_seeds(apps, schema_editor):
    ModelArchitecture = apps.get_model("collectors", "ModelArchitecture")
    ModelArchitecture.objects.filter(
        repo_id__in=[seed["repo_id"] for seed in SEEDS], untouched_seed=True).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("collectors", "0011_model_architectures"),
    ]

    operations = [
        migrations.RunPython(seed_model_architectures, delete_untouched_seeds),
    ]
