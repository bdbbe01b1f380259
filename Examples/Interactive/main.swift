print("mainspring-demo placeholder")
