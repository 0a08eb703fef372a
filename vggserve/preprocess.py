"""The old name of `vggserve.preprocessing`, kept so that `from vggserve.preprocess import center_crop` (and the
like) goes on working: importing it gives that very module (the same object, so patching one patches both).

The package attribute `vggserve.preprocess` is the function `preprocess`, never this module (see the package's
`_Package`); write `vggserve.preprocessing.<name>` to reach the module's other names as attributes.
"""

import sys

from . import preprocessing

sys.modules[__name__] = preprocessing
