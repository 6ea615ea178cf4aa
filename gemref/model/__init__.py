"""The GEM-like ranking model: its shape (config.py, ModelConfig, without torch), the model
(gem.py: GEMRef, ranking_loss, TASKS), its layers (blocks.py) and its sequence layouts
(layout.py). This file imports nothing, so `import gemref.model.config` loads only that module:
import a name from its module (`from gemref.model.gem import GEMRef`)."""
