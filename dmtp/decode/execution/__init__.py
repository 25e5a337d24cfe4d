"""How the loop's round runs, wrapped around it from outside (the tokens never change): CUDA graphs captured per
batch and span bucket, torch.compile'd stages, and the stage timer that measures each stage."""
