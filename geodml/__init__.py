"""geodml: an emulator for decentralized, geo-distributed deep learning over non-IID data.

Reproduces and extends Hsieh et al., "The Non-IID Data Quagmire of Decentralized Machine
Learning" (ICML 2020). One torchrun process per data partition; see DESIGN.md and README.md.
"""

__version__ = "0.1.0"
