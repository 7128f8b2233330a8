"""What a person looks at besides the plan's text: the live view of one SD (`specdeploy get`) and the pictures
of `plan --plot` and `probe --plot`. Pure: API objects and plans in, renderables and image files out."""
