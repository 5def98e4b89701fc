"""Drafters: anything that proposes K tokens with the distribution q they were drawn from."""

from specdec.drafters.base import Drafter, Proposal

__all__ = ["Drafter", "Proposal"]
