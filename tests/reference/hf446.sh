# The hf446 tier (.ci/tiers.sh hf446): eagle-llm 1.2.1 (SafeAILab EAGLE-1/2) and medusa-llm 0.1 (FasterDecoding
# Medusa-1), which were written against transformers 4.46-era APIs. Run by tiers.sh with PIP set to the tier venv's pip.
#
# Both wheels declare far more than their model classes use (eagle-llm: accelerate, fschat, gradio, openai,
# anthropic, sentencepiece, protobuf, wandb; medusa-llm: fschat, accelerate, sentencepiece, protobuf): the tests import
# only eagle.model.cnets / eagle.model.modeling_llama_kv and medusa.model.medusa_model, which need torch (the system
# one, never reinstalled here), transformers and huggingface_hub. So the packages go in with --no-deps, and
# transformers 4.46 with its own small dependencies (tokenizers 0.20, huggingface-hub < 1.0), which pip resolves
# against this environment: nothing that is already satisfied is installed again, and transformers needs no torch.
set -euo pipefail
$PIP install --quiet "transformers==4.46.*" "tokenizers>=0.20,<0.21" "huggingface-hub>=0.23.2,<1.0"
$PIP install --quiet --no-deps eagle-llm==1.2.1 medusa-llm==0.1
