# Copyright 2026 The MaxText NVFP4 plugin authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#    https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""MaxText NVFP4 plugin: `quantization=te_nvfp4` / `te_nvfp4_no_rht` for maxtext, installed by `register()`.

Importing the package is cheap (no maxtext, no jax); `register()` imports maxtext and installs the hooks.
"""

from MaxText.plugin import register

__all__ = ["register"]
