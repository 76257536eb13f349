"""Speculative decoding's proposers, behind one interface (proposer.py): n-gram prompt lookup
(ngram.py), a draft model (draft_model.py), an EAGLE3 head that reads the target's hidden states
(eagle3.py) and DeepSeek-V3's own MTP module, which does too (mtp.py); the one the settings name
(factory.py, `make_proposer`); and what speculation gave (metrics.py). The verifier is sut/sample/verifier.py."""
