"""The reward model (MobileRL App. D.3.2): traces rendered for a judge (render), labelled traces of graded
policies (traces), the judge and its ``RewardModel.score`` (judge), its fine-tuning and evaluation (train)."""
