"""AdaGRPO (MobileRL §2.2): multi-turn GRPO with shortest-path reward adjustment (``spa``), difficulty-adaptive
positive replay (``adapr``), failure curriculum filtering (``fcf``); the loss in ``loss``."""
